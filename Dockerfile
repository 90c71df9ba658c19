# substrate-gpu images. The default target (the last stage, `agent`) is the production node
# agent; the demo is a separate target that docker-compose.yml asks for by name.
#
#   docker build -t substrate-gpu .                  # production agent (builds runsc: minutes)
#   docker build --target demo -t substrate-gpu:demo .   # what `docker compose up` runs
#
# glibc-based on purpose (Debian bookworm): nvidia-ctk, mounted in from the node's toolkit,
# cannot run on musl. Both targets run as the unprivileged user `substrate` (uid 10001).
# docs/agent.md ("The image") says what the default command expects from its pod.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG GO_IMAGE=golang:1.26-bookworm

# runsc from source, at the version scripts/runsc.version pins, the way CI builds it
# (scripts/build-runsc.sh: module hash checked, `runsc --version` checked).
FROM ${GO_IMAGE} AS runsc
WORKDIR /src
COPY scripts/build-runsc.sh scripts/runsc.version ./scripts/
ENV SUBSTRATE_GPU_CACHE=/cache
RUN bin="$(sh scripts/build-runsc.sh)" \
    && install -D -m 0755 "$bin" /out/runsc \
    && /out/runsc --version

# The substrate-gpu wheel (the lifecycle machine travels in it as data: share/substrate-gpu).
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY substrate_gpu ./substrate_gpu
COPY machines ./machines
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# What both targets share: the package installed, the unprivileged user.
FROM ${PYTHON_IMAGE} AS base
COPY --from=wheel /wheels /tmp/wheels
RUN pip install --no-cache-dir /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels \
    && useradd --system --uid 10001 --user-group --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin substrate
EXPOSE 9477
ENTRYPOINT ["substrate-gpu"]

# The demo: a simulated GPU node, no GPU, no runsc needed. gcc + libc headers: the demo's
# simulated node builds real ELF driver libraries.
FROM base AS demo
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
USER 10001:10001
CMD ["agent", "--demo", "--metrics-host", "0.0.0.0", "--metrics-port", "9477"]

# The production agent (the default target). State lives under /var/lib/substrate-gpu (the
# event log and checkpoints: mount storage that outlives the pod there), the socket and
# runsc's and the CDI spec's scratch under /run/substrate-gpu. Metrics, /healthz and /readyz
# on 0.0.0.0:9477.
FROM base AS agent
COPY --from=runsc /out/runsc /usr/local/bin/runsc
RUN install -d -o 10001 -g 10001 -m 0700 \
        /var/lib/substrate-gpu /var/lib/substrate-gpu/checkpoints \
        /run/substrate-gpu /run/substrate-gpu/runsc /run/substrate-gpu/cdi
USER 10001:10001
CMD ["--log-format", "json", "agent", \
     "--socket", "/run/substrate-gpu/agent.sock", \
     "--event-log", "/var/lib/substrate-gpu/events.jsonl", \
     "--checkpoint-root", "/var/lib/substrate-gpu/checkpoints", \
     "--runsc", "/usr/local/bin/runsc", \
     "--runsc-root", "/run/substrate-gpu/runsc", \
     "--cdi-output-dir", "/run/substrate-gpu/cdi", \
     "--metrics-host", "0.0.0.0", \
     "--metrics-port", "9477"]
