# rtable's two images, from one build (docs/helm.md):
#   docker build --target operator -t rtable/rtable-operator:0.1.0 .   ENTRYPOINT rtable-operator
#   docker build --target core     -t rtable/rtable:0.1.0 .            ENTRYPOINT rtable-core
# The replica StatefulSets the operator makes give the container only `args`, so the core
# image's entrypoint must be rtable-core; the operator gets its image name from
# RTABLE_CORE_IMAGE (the chart's coreImage). Without --target: the operator image (last stage).

# --- build: the toolchain and -dev packages of scripts/install-deps.sh (configure needs all of
# them, GoogleTest and the JDK included), then only the three binaries the images ship.
FROM debian:bookworm AS build
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      g++ cmake ninja-build pkg-config openjdk-17-jdk-headless ccache \
      libzookeeper-mt-dev libcpprest-dev libssl-dev libyaml-cpp-dev prometheus-cpp-dev \
      libspdlog-dev libfmt-dev nlohmann-json3-dev libgtest-dev libxxhash-dev libzstd-dev \
      libcurl4-openssl-dev libsimdjson-dev zookeeper libslf4j-java openssl tzdata \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
 && cmake --build build --target rtable-core rtable-operator rtable-inspect \
 && strip --strip-debug build/bin/rtable-core build/bin/rtable-operator build/bin/rtable-inspect

# --- runtime: Debian 12's shared libraries the binaries link (helm/test-chart.sh checks this list
# against `ldd` of the binaries and `dpkg -S`), tzdata (the time zones BackupSchedules name; UTC
# works without it), and a non-root user.
FROM debian:bookworm-slim AS runtime
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      libzookeeper-mt2 libcpprest2.10 libssl3 libyaml-cpp0.7 \
      libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 \
      libspdlog1.10 libfmt9 libxxhash0 libzstd1 libcurl4 libsimdjson14 ca-certificates tzdata \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 rtable \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin rtable
# The replica pods run as 10001 with fsGroup 10001 (the operator's pod securityContext) and keep
# their data on the volume mounted here.
RUN mkdir -p /var/lib/rtable && chown 65532:65532 /var/lib/rtable
USER 65532:65532
# Both images hold all three binaries (rtable-inspect for `kubectl exec`), as
# scripts/build-image.sh builds them where there is no container engine.
COPY --from=build /src/build/bin/rtable-core /src/build/bin/rtable-operator \
     /src/build/bin/rtable-inspect /usr/local/bin/

FROM runtime AS core
ENTRYPOINT ["rtable-core"]

FROM runtime AS operator
ENTRYPOINT ["rtable-operator"]
