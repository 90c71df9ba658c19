# The substrate-gpu agent image used by docker-compose.yml (demo mode).
# glibc-based on purpose: nvidia-ctk, when mounted in on a real node, cannot run on musl.
FROM python:3.11-slim-bookworm

WORKDIR /src
COPY pyproject.toml README.md ./
COPY substrate_gpu ./substrate_gpu
COPY machines ./machines
# gcc + libc headers: the demo's simulated node builds real ELF driver libraries.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir . \
    && useradd --system --uid 10001 --no-create-home substrate

USER substrate
EXPOSE 9477
ENTRYPOINT ["substrate-gpu"]
CMD ["agent", "--demo", "--metrics-host", "0.0.0.0", "--metrics-port", "9477"]
