// Several rows through a linear layer at once, each row with the digits of its own 1-row product.
//
// Why: torch's 1-row product on the CPU (MKL's sgemv) sums a row's products in a fixed order.
// The order depends on the CPU, the shapes and the thread count, never on the values, and the
// other rows do not change it. So it can be measured (tests/engine/test_exact_rows_kernel.py's
// meeting sizes: one huge value, its negative and ones elsewhere; the sum counts the ones added
// after the two met), and one pass over the weight can serve every row: a weight row is read once
// for all rows instead of once a row, as the batched 1-row products do.
//
// The summation orders. This is the one place that explains them; every other mention points here.
// - "four lanes" (MKL's kernel on AVX2 and earlier AVX-512 CPUs): lane j takes products 4c + j
//   in turn, lane 0 starting with products 0 to 3 summed one by one; each product is rounded
//   before it is added (no fused multiply-add); then (lane 0 + lane 2) + (lane 1 + lane 3). The
//   same for every input length and every output count that is a multiple of four.
// - "sixteen fused lanes" (MKL's kernel on a Sapphire Rapids Xeon, AVX-512): lane 0 starts with
//   product 0; lane l then takes products 1 + l + 16c in turn, c = 0, 1, ... while sixteen remain,
//   each with a fused multiply-add; the lanes are halved (l + l+8, l + l+4, l + l+2, l + l+1); the
//   r < 16 products left are fused into a vector holding that total in lane 0 and zero elsewhere,
//   which is halved again. There each of MKL's threads takes a contiguous share of the outputs,
//   and the last outputs of a share that is not a multiple of four are summed in yet another
//   order, which this kernel does not copy (the shape probe finds such shapes; none of the bundled
//   model's is one).
// `set_sum_order` picks the order. exact_rows_kernel.py probes which one this CPU's product takes
// when the kernel is built, then every weight shape at every thread count before a pass uses it
// (the decisions: engine/fast/proofs.py; the paths: docs/fast-paths.md).
//
// Compiled with -ffp-contract=off so that no multiply and add are ever fused by the compiler: the
// four lanes order rounds each product, and the fused order fuses with explicit intrinsics.

#include <ATen/Parallel.h>
#include <torch/library.h>
#include <torch/types.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <string>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace {

// ---- a helper thread of the kernel's own, for a lone visitor's few rows on two threads ------
//
// Why: the server runs with OMP_WAIT_POLICY=PASSIVE (its idle threads must not spin while page
// scripts need the cores), so every OpenMP parallel region first wakes a sleeping thread. A decode
// step opens one per product call, and the wake-ups made a lone step's products markedly slower
// (`python -m bench.lone_bench`; figures in docs/benchmarks.md). This thread spins for a short
// while after each call, through the gaps between one step's products, and then sleeps. The split
// changes no digit: each output is summed whole by one thread either way.

constexpr auto kSpinBeforeSleep = std::chrono::microseconds(300);
// One visitor's rows only (a lone step, a verify pass): several visitors' packed passes keep
// OpenMP's threads, for with the helper a class of visitors made fewer tokens a second
// (`python -m bench.sched_bench`; docs/benchmarks.md).
constexpr int64_t kPairMaxRows = 16;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

class PairWorker {
 public:
  static PairWorker& get() {
    static PairWorker* worker = new PairWorker();  // never destroyed: its thread lives as long as the process
    return *worker;
  }

  // Runs `theirs` on the helper thread and `ours` on this one, and returns when both are done;
  // false (nothing run) where another call holds the helper.
  bool try_run(const std::function<void()>& theirs, const std::function<void()>& ours) {
    std::unique_lock<std::mutex> call(call_, std::try_to_lock);
    if (!call.owns_lock()) return false;
    job_ = &theirs;
    const uint64_t ticket = posted_.load(std::memory_order_relaxed) + 1;
    posted_.store(ticket, std::memory_order_release);
    { std::lock_guard<std::mutex> lock(sleep_); }  // a helper about to sleep has checked, or will see it
    wake_.notify_one();
    ours();
    while (done_.load(std::memory_order_acquire) != ticket) cpu_relax();
    return true;
  }

 private:
  PairWorker() : thread_([this] { loop(); }) { thread_.detach(); }

  void loop() {
    uint64_t seen = 0;
    for (;;) {
      const auto idle_since = std::chrono::steady_clock::now();
      while (posted_.load(std::memory_order_acquire) == seen) {
        if (std::chrono::steady_clock::now() - idle_since > kSpinBeforeSleep) {
          std::unique_lock<std::mutex> lock(sleep_);
          wake_.wait(lock, [&] { return posted_.load(std::memory_order_acquire) != seen; });
          break;
        }
        cpu_relax();
      }
      seen = posted_.load(std::memory_order_acquire);
      (*job_)();
      done_.store(seen, std::memory_order_release);
    }
  }

  std::mutex call_, sleep_;
  std::condition_variable wake_;
  std::atomic<uint64_t> posted_{0}, done_{0};
  const std::function<void()>* job_ = nullptr;
  std::thread thread_;  // last: started once the rest is ready
};

// Whether OpenMP's idle threads sleep (OMP_WAIT_POLICY=PASSIVE, as the server runs): only then does
// the helper pay. Where they spin (the default), a spinning helper competes with them for the
// cores and made the step several times slower (`python -m bench.lone_bench`; docs/benchmarks.md).
bool openmp_threads_sleep() {
  static const bool sleep = [] {
    const char* policy = std::getenv("OMP_WAIT_POLICY");
    if (policy == nullptr) return false;
    std::string lowered(policy);
    for (auto& c : lowered) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return lowered == "passive";
  }();
  return sleep;
}

// body(begin, end) over [0, total): on the helper and this thread for one visitor's rows at two
// torch threads where OpenMP's threads sleep, else through torch's own parallel_for.
template <typename Body>
void split_blocks(int64_t total, int64_t grain, bool one_visitor, const Body& body) {
  if (one_visitor && openmp_threads_sleep() && at::get_num_threads() == 2 && !at::in_parallel_region() &&
      total >= 2 * grain) {
    const int64_t half = (total + 1) / 2;
    const std::function<void()> theirs = [&] { body(half, total); };
    const std::function<void()> ours = [&] { body(0, half); };
    if (PairWorker::get().try_run(theirs, ours)) return;
  }
  at::parallel_for(0, total, grain, body);
}


typedef float v4 __attribute__((vector_size(16)));
typedef float v16 __attribute__((vector_size(64)));

constexpr int kRowsPerVector = 4;  // a v16 holds the four lanes of four rows
constexpr int kOutputsPerBlock = 4;

inline v16 repeat_lanes(const float* w) {
#ifdef __AVX512F__
  return (v16)_mm512_broadcast_f32x4(_mm_loadu_ps(w));
#else
  v4 four;
  std::memcpy(&four, w, sizeof(four));
  return __builtin_shufflevector(four, four, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
#endif
}

inline v16 load16(const float* p) {
  v16 x;
  std::memcpy(&x, p, sizeof(x));
  return x;
}

// Lane 0 of each row: ((p0 + p1) + p2) + p3; lanes 1 to 3: zero.
inline v16 first_chunk(v16 p) {
  v16 sum = p + __builtin_shufflevector(p, p, 1, 0, 0, 0, 5, 0, 0, 0, 9, 0, 0, 0, 13, 0, 0, 0);
  sum = sum + __builtin_shufflevector(p, p, 2, 0, 0, 0, 6, 0, 0, 0, 10, 0, 0, 0, 14, 0, 0, 0);
  sum = sum + __builtin_shufflevector(p, p, 3, 0, 0, 0, 7, 0, 0, 0, 11, 0, 0, 0, 15, 0, 0, 0);
  const v16 zero = {};  // lanes 1 to 3 taken from here (multiplying by 0 would turn an infinity into NaN)
  return __builtin_shufflevector(sum, zero, 0, 16, 16, 16, 4, 16, 16, 16, 8, 16, 16, 16, 12, 16, 16, 16);
}

// Lane 0 of each row: (l0 + l2) + (l1 + l3).
inline v16 lanes_summed(v16 acc) {
  v16 pairs = acc + __builtin_shufflevector(acc, acc, 2, 3, 0, 0, 6, 7, 0, 0, 10, 11, 0, 0, 14, 15, 0, 0);
  return pairs + __builtin_shufflevector(pairs, pairs, 1, 0, 0, 0, 5, 0, 0, 0, 9, 0, 0, 0, 13, 0, 0, 0);
}

// `vectors` * 4 rows of packed x against the four outputs o[0..3] of w (repeats where fewer
// remain: each is computed whole, only the first `count` are written).
template <int vectors>
void output_block(const float* packed, int64_t padded_rows, const float* w, int64_t in, const int64_t* o, int count,
                  float* out, int64_t rows, int64_t row0, int64_t out_features) {
  const float* w_rows[kOutputsPerBlock];
  for (int q = 0; q < kOutputsPerBlock; ++q) w_rows[q] = w + o[q] * in;
  const float* x0 = packed + row0 * 4;
  v16 acc[kOutputsPerBlock][vectors];
  for (int q = 0; q < kOutputsPerBlock; ++q) {
    const v16 weights = repeat_lanes(w_rows[q]);
    for (int b = 0; b < vectors; ++b) acc[q][b] = first_chunk(weights * load16(x0 + b * 16));
  }
  const int64_t chunks = in / 4;
  for (int64_t c = 1; c < chunks; ++c) {
    const float* x_chunk = x0 + c * padded_rows * 4;
    v16 x[vectors];
    for (int b = 0; b < vectors; ++b) x[b] = load16(x_chunk + b * 16);
    for (int q = 0; q < kOutputsPerBlock; ++q) {
      const v16 weights = repeat_lanes(w_rows[q] + c * 4);
      for (int b = 0; b < vectors; ++b) acc[q][b] = acc[q][b] + weights * x[b];
    }
  }
  for (int q = 0; q < count; ++q) {
    for (int b = 0; b < vectors; ++b) {
      const v16 total = lanes_summed(acc[q][b]);
      for (int r = 0; r < kRowsPerVector; ++r) {
        const int64_t row = row0 + b * kRowsPerVector + r;
        if (row < rows) out[row * out_features + o[q]] = total[r * 4];
      }
    }
  }
}

// One row: lane (q, j) of a vector is lane j of output q's sum, four outputs a vector, so that
// a single row wastes no lanes. 16 inputs of each of the four outputs' weight rows are read at
// once and their products regrouped so that vector k holds chunk k of each output: the chunks
// are still added in turn, as the 1-row product adds them.
inline void chunks_regrouped(v16 p0, v16 p1, v16 p2, v16 p3, v16* t) {
  const v16 lo01 = __builtin_shufflevector(p0, p1, 0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const v16 hi01 = __builtin_shufflevector(p0, p1, 8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  const v16 lo23 = __builtin_shufflevector(p2, p3, 0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const v16 hi23 = __builtin_shufflevector(p2, p3, 8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  t[0] = __builtin_shufflevector(lo01, lo23, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
  t[1] = __builtin_shufflevector(lo01, lo23, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  t[2] = __builtin_shufflevector(hi01, hi23, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
  t[3] = __builtin_shufflevector(hi01, hi23, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
}

// Chunk c (four inputs) of each of the four weight rows against the same four inputs of x.
inline v16 chunk_products(const float* const* w_rows, const float* x, int64_t c) {
  float w[16];
  for (int q = 0; q < kOutputsPerBlock; ++q) std::memcpy(w + q * 4, w_rows[q] + c * 4, 4 * sizeof(float));
  return load16(w) * repeat_lanes(x + c * 4);
}

// The single row x [in] against `groups` * 4 outputs of w starting at o[0] (o: each group's
// four output rows, repeats where fewer remain; only the first `count` are written).
template <int groups>
void one_row_block(const float* x, const float* w, int64_t in, const int64_t* o, int count, float* out) {
  const float* w_rows[groups][kOutputsPerBlock];
  for (int g = 0; g < groups; ++g)
    for (int q = 0; q < kOutputsPerBlock; ++q) w_rows[g][q] = w + o[g * kOutputsPerBlock + q] * in;
  v16 acc[groups];
  for (int g = 0; g < groups; ++g) acc[g] = first_chunk(chunk_products(w_rows[g], x, 0));
  const int64_t chunks = in / 4;
  int64_t c = 1;
  for (; c < 4 && c < chunks; ++c)  // up to the first 16 inputs' end, a chunk at a time
    for (int g = 0; g < groups; ++g) acc[g] = acc[g] + chunk_products(w_rows[g], x, c);
  // the next block's rows, fetched into the cache while this block's are summed: each weight row
  // is only a few KB, too short for the CPU's own prefetcher to get going (alternating builds of
  // `python -m bench.lone_bench` measured it; docs/benchmarks.md)
  const int64_t ahead = static_cast<int64_t>(groups) * kOutputsPerBlock * in;
  for (; c + 4 <= chunks; c += 4) {  // 16 inputs of each output at a time
    const v16 x16 = load16(x + c * 4);
    for (int g = 0; g < groups; ++g)
      for (int q = 0; q < kOutputsPerBlock; ++q) __builtin_prefetch(w_rows[g][q] + ahead + c * 4, 0, 3);
    for (int g = 0; g < groups; ++g) {
      v16 t[4];
      chunks_regrouped(load16(w_rows[g][0] + c * 4) * x16, load16(w_rows[g][1] + c * 4) * x16,
                       load16(w_rows[g][2] + c * 4) * x16, load16(w_rows[g][3] + c * 4) * x16, t);
      acc[g] = acc[g] + t[0];
      acc[g] = acc[g] + t[1];
      acc[g] = acc[g] + t[2];
      acc[g] = acc[g] + t[3];
    }
  }
  for (; c < chunks; ++c)
    for (int g = 0; g < groups; ++g) acc[g] = acc[g] + chunk_products(w_rows[g], x, c);
  for (int g = 0; g < groups; ++g) {
    const v16 total = lanes_summed(acc[g]);
    for (int q = 0; q < kOutputsPerBlock && g * kOutputsPerBlock + q < count; ++q) out[o[g * kOutputsPerBlock + q]] = total[q * 4];
  }
}

#ifdef __AVX512F__
constexpr bool kPackedRowsPay = true;  // the packed path, four rows to a vector (rows_linears)
#else
constexpr bool kPackedRowsPay = false;
#endif
// Up to this many rows go row by row even where the packed path pays: padded to whole vectors and
// given one thread per 4M products, the packed path took a verify pass's 2 or 3 rows several times
// as long as one row, where row by row they cost little more; a little above 8 rows the two paths
// tie, and builds with a larger bound here made the single-row path's lone step slower
// (alternated builds, `python -m bench.rows_bench`; docs/benchmarks.md): so 8.
constexpr int64_t kRowByRowMaxRows = 8;
constexpr int kOneRowGroups = 2;  // outputs in flight: 2 x 4 weight rows streamed at once

// x [rows, in] through every weight, each row by the single-row kernel: one parallel region for
// all weights, and each block of weight rows fetched from memory once, then summed against every
// row while it is still in the L1 cache.
std::vector<torch::Tensor> one_row_linears(const torch::Tensor& x, std::vector<torch::Tensor>& weights,
                                           std::vector<torch::Tensor>& outs, bool one_visitor) {
  const int64_t rows = x.size(0), in = x.size(1);
  constexpr int64_t kOutputs = kOneRowGroups * kOutputsPerBlock;
  std::vector<int64_t> first_block{0};
  for (const auto& weight : weights) first_block.push_back(first_block.back() + (weight.size(0) + kOutputs - 1) / kOutputs);
  const float* x_data = x.data_ptr<float>();
  // waking a second thread costs microseconds: give each thread at least this many products
  constexpr int64_t kProductsPerTask = 1 << 16;
  const int64_t grain = std::max<int64_t>(1, kProductsPerTask / (kOutputs * in * rows));
  split_blocks(first_block.back(), grain, one_visitor, [&](int64_t begin, int64_t end) {
    size_t i = 0;
    for (int64_t block = begin; block < end; ++block) {
      while (block >= first_block[i + 1]) ++i;
      const int64_t out_features = weights[i].size(0);
      const int64_t first = (block - first_block[i]) * kOutputs;
      const int count = static_cast<int>(std::min<int64_t>(kOutputs, out_features - first));
      int64_t o[kOutputs];
      for (int q = 0; q < kOutputs; ++q) o[q] = first + std::min(q, count - 1);
      for (int64_t row = 0; row < rows; ++row)
        one_row_block<kOneRowGroups>(x_data + row * in, weights[i].data_ptr<float>(), in, o, count,
                                     outs[i].data_ptr<float>() + row * out_features);
    }
  });
  return outs;
}


// ---- the sixteen fused lanes order (kSixteenFused) --------------------------------------------

constexpr int kFourLanes = 0;
constexpr int kSixteenFused = 1;
int sum_order = kFourLanes;  // set once, before any pass, by set_sum_order

#if defined(__AVX512F__) && defined(__AVX512DQ__)
// l + l+8, then l + l+4, l + l+2, l + l+1: lane 0 of each step, as MKL's kernel halves its lanes.
inline float halved(__m512 v) {
  const __m256 eight = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
}

// `R` rows (x_rows) against the `O` outputs o[0..O-1] of w (repeats where fewer remain: only the
// first `count` are written). The block's weight rows are streamed once for all R rows.
template <int O, int R>
void fused_block(const float* const* x_rows, const float* w, int64_t in, const int64_t* o, int count,
                 float* const* outs, bool prefetch) {
  const float* w_rows[O];
  for (int q = 0; q < O; ++q) w_rows[q] = w + o[q] * in;
  const __mmask16 first = 1;
  __m512 acc[O][R];
  __m512 x_first[R];
  for (int r = 0; r < R; ++r) x_first[r] = _mm512_maskz_loadu_ps(first, x_rows[r]);
  for (int q = 0; q < O; ++q) {
    const __m512 w_first = _mm512_maskz_loadu_ps(first, w_rows[q]);
    for (int r = 0; r < R; ++r) acc[q][r] = _mm512_fmadd_ps(w_first, x_first[r], _mm512_setzero_ps());
  }
  const int64_t chunks = (in - 1) / 16;
  const int64_t ahead = static_cast<int64_t>(O) * in;  // the next block's rows (they follow these)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t at = 1 + c * 16;
    if (prefetch)
      for (int q = 0; q < O; ++q) __builtin_prefetch(w_rows[q] + ahead + at, 0, 3);
    __m512 x[R];
    for (int r = 0; r < R; ++r) x[r] = _mm512_loadu_ps(x_rows[r] + at);
    for (int q = 0; q < O; ++q) {
      const __m512 weights = _mm512_loadu_ps(w_rows[q] + at);
      for (int r = 0; r < R; ++r) acc[q][r] = _mm512_fmadd_ps(weights, x[r], acc[q][r]);
    }
  }
  const int64_t at = 1 + chunks * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (in - at)) - 1u);
  __m512 x_tail[R];
  for (int r = 0; r < R; ++r) x_tail[r] = _mm512_maskz_loadu_ps(tail, x_rows[r] + at);
  for (int q = 0; q < count; ++q) {
    const __m512 w_tail = _mm512_maskz_loadu_ps(tail, w_rows[q] + at);
    for (int r = 0; r < R; ++r) {
      const __m512 total = _mm512_zextps128_ps512(_mm_set_ss(halved(acc[q][r])));
      outs[r][o[q]] = tail ? halved(_mm512_fmadd_ps(w_tail, x_tail[r], total)) : _mm_cvtss_f32(_mm512_castps512_ps128(total));
    }
  }
}

// Rows `row0 .. row0 + R - 1` of x against one block of outputs.
template <int O, int R>
void fused_rows(const float* x, int64_t row0, const float* w, int64_t in, const int64_t* o, int count, float* out,
                int64_t out_features, bool prefetch) {
  const float* x_rows[R];
  float* outs[R];
  for (int r = 0; r < R; ++r) {
    x_rows[r] = x + (row0 + r) * in;
    outs[r] = out + (row0 + r) * out_features;
  }
  fused_block<O, R>(x_rows, w, in, o, count, outs, prefetch);
}

constexpr int kFusedRowsPerGroup = 4;  // beyond four rows: groups of four, four outputs a block
constexpr int kFusedMaxOutputs = 8;

// Outputs a block for `rows` rows: as many weight rows in flight as the accumulators allow (up to
// 24 of the 32 vector registers), so that a few rows stream the weights as fast as one does.
int fused_outputs(int64_t rows) { return rows <= 3 ? 8 : rows == 4 ? 6 : 4; }

// Every row of x through every weight in the sixteen fused lanes order: one parallel region.
void fused_linears(const torch::Tensor& x, std::vector<torch::Tensor>& weights, std::vector<torch::Tensor>& outs,
                   bool one_visitor) {
  const int64_t rows = x.size(0), in = x.size(1);
  const int outputs = fused_outputs(rows);
  std::vector<int64_t> first_block{0};
  for (const auto& weight : weights) first_block.push_back(first_block.back() + (weight.size(0) + outputs - 1) / outputs);
  const float* x_data = x.data_ptr<float>();
  constexpr int64_t kProductsPerTask = 1 << 16;  // waking a second thread costs microseconds
  const int64_t grain = std::max<int64_t>(1, kProductsPerTask / (outputs * in * rows));
  split_blocks(first_block.back(), grain, one_visitor, [&](int64_t begin, int64_t end) {
    size_t i = 0;
    for (int64_t block = begin; block < end; ++block) {
      while (block >= first_block[i + 1]) ++i;
      const int64_t out_features = weights[i].size(0);
      const float* w = weights[i].data_ptr<float>();
      float* out = outs[i].data_ptr<float>();
      const int64_t first = (block - first_block[i]) * outputs;
      const int count = static_cast<int>(std::min<int64_t>(outputs, out_features - first));
      int64_t o[kFusedMaxOutputs];
      for (int q = 0; q < outputs; ++q) o[q] = first + std::min(q, count - 1);
      const bool prefetch = block + 1 < first_block[i + 1];  // the next block is this weight's
      switch (rows) {
        case 1: fused_rows<8, 1>(x_data, 0, w, in, o, count, out, out_features, prefetch); continue;
        case 2: fused_rows<8, 2>(x_data, 0, w, in, o, count, out, out_features, prefetch); continue;
        case 3: fused_rows<8, 3>(x_data, 0, w, in, o, count, out, out_features, prefetch); continue;
        case 4: fused_rows<6, 4>(x_data, 0, w, in, o, count, out, out_features, prefetch); continue;
        default: break;
      }
      for (int64_t row0 = 0; row0 < rows; row0 += kFusedRowsPerGroup) {
        const bool ahead = prefetch && row0 == 0;
        switch (std::min<int64_t>(kFusedRowsPerGroup, rows - row0)) {
          case 4: fused_rows<4, 4>(x_data, row0, w, in, o, count, out, out_features, ahead); break;
          case 3: fused_rows<4, 3>(x_data, row0, w, in, o, count, out, out_features, ahead); break;
          case 2: fused_rows<4, 2>(x_data, row0, w, in, o, count, out, out_features, ahead); break;
          default: fused_rows<4, 1>(x_data, row0, w, in, o, count, out, out_features, ahead);
        }
      }
    }
  });
}
constexpr bool kSixteenFusedBuilt = true;
#else
void fused_linears(const torch::Tensor&, std::vector<torch::Tensor>&, std::vector<torch::Tensor>&, bool) {
  TORCH_CHECK(false, "the sixteen fused lanes order needs AVX-512");
}
constexpr bool kSixteenFusedBuilt = false;
#endif

// Which order the kernel sums in from now on; false (and nothing changed) where this build lacks it.
bool set_sum_order(int64_t order) {
  if (order == kSixteenFused && !kSixteenFusedBuilt) return false;
  if (order != kFourLanes && order != kSixteenFused) return false;
  sum_order = static_cast<int>(order);
  return true;
}

// x [rows, in] -> [in / 4][padded_rows][4]: a chunk of four inputs of four rows in one vector
// (rows past `rows` zero).
torch::Tensor packed_rows(const torch::Tensor& x, int64_t padded_rows) {
  const int64_t rows = x.size(0), in = x.size(1);
  auto packed = torch::empty({in / 4, padded_rows, 4}, x.options());
  const float* from = x.data_ptr<float>();
  float* to = packed.data_ptr<float>();
  for (int64_t c = 0; c < in / 4; ++c) {
    float* chunk = to + c * padded_rows * 4;
    for (int64_t r = 0; r < padded_rows; ++r) {
      for (int j = 0; j < 4; ++j) chunk[r * 4 + j] = r < rows ? from[r * in + c * 4 + j] : 0.0f;
    }
  }
  return packed;
}

// Every row of x through every weight (all of one input width): one parallel region for all, so
// a layer's query, key and value (or gate and up) wake the CPU's threads once. `one_visitor`:
// the rows are one sequence's (a verify pass), not several visitors'.
std::vector<torch::Tensor> rows_linears(const torch::Tensor& x_in, at::TensorList weights_in, bool one_visitor) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == torch::kFloat, "x: float32 [rows, in]");
  const int64_t rows = x_in.size(0), in = x_in.size(1);
  TORCH_CHECK(in % 4 == 0 && in >= 8, "in must be a multiple of 4, at least 8");
  const auto x = x_in.contiguous();
  std::vector<torch::Tensor> weights, outs;
  for (const auto& weight : weights_in) {
    TORCH_CHECK(weight.dim() == 2 && weight.size(1) == in && weight.scalar_type() == torch::kFloat,
                "weights: float32 [out, in]");
    weights.push_back(weight.contiguous());
    outs.push_back(torch::empty({rows, weight.size(0)}, x.options()));
  }
  if (rows == 0) return outs;
  if (sum_order == kSixteenFused) {
    fused_linears(x, weights, outs, one_visitor && rows <= kPairMaxRows);
    return outs;
  }
  // A few rows (kRowByRowMaxRows) go row by row, and any number without AVX-512: there the
  // packed kernel's four-row vectors are split in two and its accumulators spill, and it was
  // slower than even 1-row products row by row; row by row through the single-row kernel, a block
  // of weight rows fetched once, was the fastest of the three, with the same digits
  // (`python -m bench.rows_bench`; docs/benchmarks.md).
  if (rows <= kRowByRowMaxRows || !kPackedRowsPay)
    return one_row_linears(x, weights, outs, one_visitor && rows <= kPairMaxRows);
  std::vector<int64_t> first_block{0};  // weight i's output blocks start here
  for (const auto& weight : weights)
    first_block.push_back(first_block.back() + (weight.size(0) + kOutputsPerBlock - 1) / kOutputsPerBlock);
  constexpr int64_t kRowsPerPass = 4 * kRowsPerVector;
  const int64_t padded_rows = (rows + kRowsPerVector - 1) / kRowsPerVector * kRowsPerVector;
  const auto packed = packed_rows(x, padded_rows);
  const float* packed_data = packed.data_ptr<float>();
  // waking a second thread costs tens of microseconds: give each thread at least this many products
  constexpr int64_t kProductsPerTask = 1 << 22;
  const int64_t grain = std::max<int64_t>(1, kProductsPerTask / (kOutputsPerBlock * in * padded_rows));
  at::parallel_for(0, first_block.back(), grain, [&](int64_t begin, int64_t end) {
    size_t i = 0;
    for (int64_t block = begin; block < end; ++block) {
      while (block >= first_block[i + 1]) ++i;
      const int64_t out_features = weights[i].size(0);
      const float* w_data = weights[i].data_ptr<float>();
      float* out_data = outs[i].data_ptr<float>();
      const int64_t first = (block - first_block[i]) * kOutputsPerBlock;
      const int count = static_cast<int>(std::min<int64_t>(kOutputsPerBlock, out_features - first));
      int64_t o[kOutputsPerBlock];
      for (int q = 0; q < kOutputsPerBlock; ++q) o[q] = first + std::min(q, count - 1);
      for (int64_t row0 = 0; row0 < padded_rows; row0 += kRowsPerPass) {
        const int64_t vectors = std::min<int64_t>(4, (padded_rows - row0) / kRowsPerVector);
        switch (vectors) {
          case 4: output_block<4>(packed_data, padded_rows, w_data, in, o, count, out_data, rows, row0, out_features); break;
          case 3: output_block<3>(packed_data, padded_rows, w_data, in, o, count, out_data, rows, row0, out_features); break;
          case 2: output_block<2>(packed_data, padded_rows, w_data, in, o, count, out_data, rows, row0, out_features); break;
          default: output_block<1>(packed_data, padded_rows, w_data, in, o, count, out_data, rows, row0, out_features);
        }
      }
    }
  });
  return outs;
}

std::vector<torch::Tensor> lone_rows_linears(const torch::Tensor& x, at::TensorList weights) {
  return rows_linears(x, weights, x.size(0) == 1);
}

torch::Tensor lone_rows_linear(const torch::Tensor& x, const torch::Tensor& weight) {
  return rows_linears(x, {weight}, x.size(0) == 1)[0];
}

// One sequence's rows (a verify pass): the same digits, the helper thread allowed.
std::vector<torch::Tensor> sequence_rows_linears(const torch::Tensor& x, at::TensorList weights) {
  return rows_linears(x, weights, true);
}

torch::Tensor sequence_rows_linear(const torch::Tensor& x, const torch::Tensor& weight) {
  return rows_linears(x, {weight}, true)[0];
}

}  // namespace

TORCH_LIBRARY(token_by_token, m) {
  m.def("lone_rows_linear(Tensor x, Tensor weight) -> Tensor", &lone_rows_linear);
  m.def("lone_rows_linears(Tensor x, Tensor[] weights) -> Tensor[]", &lone_rows_linears);
  m.def("sequence_rows_linear(Tensor x, Tensor weight) -> Tensor", &sequence_rows_linear);
  m.def("sequence_rows_linears(Tensor x, Tensor[] weights) -> Tensor[]", &sequence_rows_linears);
  m.def("set_sum_order(int order) -> bool", &set_sum_order);
}
