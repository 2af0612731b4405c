# gpu-admission: the admission webhook, the node agent and the offline `check`, in one image.
#
# On any machine with network access, from a clone:
#   docker build -t REGISTRY/gpu-admission:0.1.0 .
# (the project from the source here, its dependencies from PyPI). Where no package index is reachable,
# build from a wheelhouse in the build context instead:
#   pip wheel '.[agent]' -w wheelhouse
#   docker build --build-arg WHEELHOUSE=wheelhouse -t REGISTRY/gpu-admission:0.1.0 .
# BASE must be a Debian-based image with Python 3.11 and the venv module (the default is the official
# slim image, pinned by version); tests build on a base made with debootstrap, where no registry is reachable.
ARG BASE=python:3.11.11-slim-bookworm

FROM ${BASE} AS build
# A folder of the build context holding the project's wheel and every dependency's; empty: PyPI.
ARG WHEELHOUSE=""
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# .dockerignore lets in only the source and the wheelhouse.
COPY . /src/
# A virtual environment keeps the project apart from the base image's Python packages. Its bytecode is
# compiled here, because at run time the root filesystem is read-only and nothing may be written to it.
RUN python3 -m venv /opt/gpu-admission \
 && if [ -n "${WHEELHOUSE}" ]; then \
      /opt/gpu-admission/bin/pip install --no-index --find-links "/src/${WHEELHOUSE}" 'gpu-admission[agent]'; \
    else \
      /opt/gpu-admission/bin/pip install '/src[agent]'; \
    fi \
 && /opt/gpu-admission/bin/pip uninstall --yes pip \
 && /opt/gpu-admission/bin/python -m compileall -q /opt/gpu-admission \
 && /opt/gpu-admission/bin/gpu-admission --help >/dev/null

FROM ${BASE}
ARG UID=65532
LABEL org.opencontainers.image.title="gpu-admission" \
      org.opencontainers.image.description="GPU admission controller for Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid "${UID}" gpu-admission \
 && useradd --system --uid "${UID}" --gid "${UID}" --home-dir /tmp --no-create-home \
      --shell /usr/sbin/nologin gpu-admission
COPY --from=build /opt/gpu-admission /opt/gpu-admission
# Runs on a read-only root filesystem: no bytecode writes, HOME and temporary files in /tmp (an
# emptyDir in the chart, a tmpfs with `docker run --read-only`).
ENV PATH=/opt/gpu-admission/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TMPDIR=/tmp
WORKDIR /tmp
USER ${UID}:${UID}
EXPOSE 8443 9402
ENTRYPOINT ["gpu-admission"]
CMD ["serve"]
