// Rows through a large linear layer in one pass over its weight: the logit lens's product, every
// layer's row through the LM head (engine/fast/lens_kernel.py).
//
// Why: with a few dozen rows, the CPU's matrix product (F.linear) runs at a fraction of its rate on
// a square product, and in slices of the weight (the bundled model's head is 49,152 x 576) the same
// product was faster: what costs is taking the whole weight at once, not the arithmetic
// (`python -m bench.inside_bench`; figures in docs/benchmarks.md). Here each weight row is read where it lies, once for every row of x: a block of
// weight rows stays in the L2 cache while each group of x rows (in L1) meets it.
//
// Not the digits of any other product (each output is a sum of fused multiply-adds in vector
// lanes, then the lanes): the lens of the layers below the last is a view, and the last layer's
// lens is the step's own logits, never this.

#include <ATen/Parallel.h>
#include <torch/library.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;  // AVX2, or whatever the compiler makes of the vector type
#endif
constexpr int kWeightRows = 2;  // a tile: two weight rows against six x rows, twelve accumulators
constexpr int kXRows = 6;
constexpr int64_t kBlockRows = 64;  // weight rows a block: 64 x 2.3 KB stays in L2 for the bundled model

typedef float vec __attribute__((vector_size(kLanes * sizeof(float))));

inline vec load(const float* p) {
  vec v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// xs rows of x against weight rows n0 .. n0 + ws - 1 (ws <= kWeightRows; the last row repeats
// where fewer remain: computed, not written).
template <int xs>
void tile(const float* w, int64_t in, int64_t n0, int ws, const float* x, float* out, int64_t out_features) {
  vec acc[kWeightRows][xs] = {};
  const float* w_rows[kWeightRows];
  for (int q = 0; q < kWeightRows; ++q) w_rows[q] = w + (n0 + std::min(q, ws - 1)) * in;
  const int64_t whole = in / kLanes * kLanes;
  for (int64_t k = 0; k < whole; k += kLanes) {
    vec wv[kWeightRows];
    for (int q = 0; q < kWeightRows; ++q) wv[q] = load(w_rows[q] + k);
    for (int j = 0; j < xs; ++j) {
      const vec xv = load(x + j * in + k);
      for (int q = 0; q < kWeightRows; ++q) acc[q][j] += wv[q] * xv;
    }
  }
  for (int j = 0; j < xs; ++j) {
    for (int q = 0; q < ws; ++q) {
      float sum = 0.0f;
      for (int lane = 0; lane < kLanes; ++lane) sum += acc[q][j][lane];
      for (int64_t k = whole; k < in; ++k) sum += w_rows[q][k] * x[j * in + k];
      out[j * out_features + n0 + q] = sum;
    }
  }
}

// Weight rows first .. last - 1 towards the L2 cache, while this block is computed: a block read
// straight from memory ran at half the speed of one already in L2 (one thread, 30 rows).
inline void prefetch_rows(const float* w, int64_t in, int64_t first, int64_t last) {
  constexpr int64_t kLineFloats = 64 / sizeof(float);
  for (int64_t n = first; n < last; ++n) {
    const float* row = w + n * in;
    for (int64_t k = 0; k < in; k += kLineFloats) __builtin_prefetch(row + k, 0, 2);
  }
}

// x [rows, in] by weight [out, in] -> [rows, out], float32.
torch::Tensor lens_linear(const torch::Tensor& x_in, const torch::Tensor& w_in) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == torch::kFloat, "x: float32 [rows, in]");
  TORCH_CHECK(w_in.dim() == 2 && w_in.size(1) == x_in.size(1) && w_in.scalar_type() == torch::kFloat,
              "weight: float32 [out, in]");
  const auto x = x_in.contiguous();
  const auto w = w_in.contiguous();
  const int64_t rows = x.size(0), in = x.size(1), out_features = w.size(0);
  auto out = torch::empty({rows, out_features}, x.options());
  if (rows == 0 || out_features == 0) return out;
  const float* xd = x.data_ptr<float>();
  const float* wd = w.data_ptr<float>();
  float* od = out.data_ptr<float>();
  const int64_t blocks = (out_features + kBlockRows - 1) / kBlockRows;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    const int64_t mine = std::min(out_features, end * kBlockRows);  // this thread's rows end here
    for (int64_t b = begin; b < end; ++b) {
      const int64_t first = b * kBlockRows, last = std::min(out_features, first + kBlockRows);
      for (int64_t j0 = 0; j0 < rows; j0 += kXRows) {
        const int64_t xs = std::min<int64_t>(kXRows, rows - j0);
        for (int64_t n0 = first; n0 < last; n0 += kWeightRows) {
          const int ws = static_cast<int>(std::min<int64_t>(kWeightRows, last - n0));
          if (j0 == 0) prefetch_rows(wd, in, n0 + kBlockRows, std::min(n0 + kBlockRows + ws, mine));
          if (xs == kXRows) {
            tile<kXRows>(wd, in, n0, ws, xd + j0 * in, od + j0 * out_features, out_features);
          } else {  // the last few rows one at a time
            for (int64_t j = j0; j < j0 + xs; ++j) tile<1>(wd, in, n0, ws, xd + j * in, od + j * out_features, out_features);
          }
        }
      }
    }
  });
  return out;
}

// e^x for x <= 0 in every lane, to about one unit in the last place: x = n ln 2 + r with
// |r| <= ln 2 / 2, e^r by its Taylor series to r^7 (the next term is below 2^-27), times 2^n;
// below -87 (where float32 underflows) 0.
inline vec exp_of_nonpositive(vec x) {
  const vec zero = {};
  const vec low = zero - 87.0f;
  const vec clamped = x < low ? low : x;
  const vec shift = zero + 12582912.0f;  // 1.5 * 2^23: adding and taking it away rounds to the nearest integer
  const vec n = (clamped * 1.44269504088896341f + shift) - shift;
  const vec r = (clamped - n * 0.693145751953125f) - n * 1.42860682030941723212e-6f;  // ln 2, hi + lo
  vec p = zero + (1.0f / 5040.0f);
  p = p * r + (1.0f / 720.0f);
  p = p * r + (1.0f / 120.0f);
  p = p * r + (1.0f / 24.0f);
  p = p * r + (1.0f / 6.0f);
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  typedef int32_t ivec __attribute__((vector_size(kLanes * sizeof(int32_t))));
  const ivec scale = (__builtin_convertvector(n, ivec) + 127) << 23;  // 2^n, n in [-126, 0]
  vec twos;
  std::memcpy(&twos, &scale, sizeof(twos));
  return x < low ? zero : p * twos;
}

// One lens row's statistics: its top token (the first of equal maxima), that token's probability,
// the pick's probability and rank (1 + the logits above the pick's), the entropy in bits; NaN
// entropy where a logit is not finite (the caller then takes torch's own path).
void row_statistics(const float* z, int64_t size, int64_t pick, double* out) {
  const int64_t whole = size / kLanes * kLanes;
  vec most = load(z);
  for (int64_t k = kLanes; k < whole; k += kLanes) {
    const vec v = load(z + k);
    most = v > most ? v : most;
  }
  float top_logit = most[0];
  for (int lane = 1; lane < kLanes; ++lane) top_logit = std::max(top_logit, most[lane]);
  for (int64_t k = whole; k < size; ++k) top_logit = std::max(top_logit, z[k]);
  int64_t top = 0;
  while (top < size && z[top] != top_logit) ++top;
  const float picked = z[pick];
  double total = 0.0, weighted = 0.0;  // sum of e^(z - top), and of e^(z - top) (z - top)
  int64_t above = 0;
  constexpr int64_t kChunk = 512;  // summed in float a chunk at a time, the chunks in double
  for (int64_t start = 0; start < whole; start += kChunk) {
    const int64_t stop = std::min(whole, start + kChunk);
    vec chunk_total = {}, chunk_weighted = {};
    for (int64_t k = start; k < stop; k += kLanes) {
      const vec v = load(z + k);
      const vec shifted = v - top_logit;
      const vec e = exp_of_nonpositive(shifted);
      chunk_total += e;
      chunk_weighted += e * shifted;
      for (int lane = 0; lane < kLanes; ++lane) above += v[lane] > picked;
    }
    for (int lane = 0; lane < kLanes; ++lane) {
      total += chunk_total[lane];
      weighted += chunk_weighted[lane];
    }
  }
  for (int64_t k = whole; k < size; ++k) {
    const double shifted = static_cast<double>(z[k]) - top_logit;
    total += std::exp(shifted);
    weighted += std::exp(shifted) * shifted;
    above += z[k] > picked;
  }
  const bool finite = std::isfinite(top_logit) && std::isfinite(total) && std::isfinite(weighted);
  out[0] = static_cast<double>(top);
  out[1] = 1.0 / total;
  out[2] = std::exp(static_cast<double>(picked) - top_logit) / total;
  out[3] = static_cast<double>(above + 1);
  // H = -sum p log p with p = e^(z - top) / total: log total - weighted / total, in nats
  out[4] = finite ? (std::log(total) - weighted / total) / std::log(2.0) : std::nan("");
}

// rows [count, vocab] float32 -> [count, 5] float64: top token, its p, the pick's p, the pick's
// rank, entropy in bits, one row per thread's turn.
torch::Tensor lens_statistics(const torch::Tensor& rows_in, int64_t pick) {
  TORCH_CHECK(rows_in.dim() == 2 && rows_in.scalar_type() == torch::kFloat, "rows: float32 [count, vocab]");
  const int64_t size = rows_in.size(1);
  TORCH_CHECK(size >= kLanes && pick >= 0 && pick < size, "pick: a token of the vocabulary");
  const auto rows = rows_in.contiguous();
  auto out = torch::empty({rows.size(0), 5}, rows.options().dtype(torch::kDouble));
  const float* data = rows.data_ptr<float>();
  double* out_data = out.data_ptr<double>();
  at::parallel_for(0, rows.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) row_statistics(data + r * size, size, pick, out_data + r * 5);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(token_by_token_lens, m) {
  m.def("lens_linear(Tensor x, Tensor weight) -> Tensor", &lens_linear);
  m.def("lens_statistics(Tensor rows, int pick) -> Tensor", &lens_statistics);
}
