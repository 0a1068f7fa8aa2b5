# The runtime image every training pod runs: CUDA PyTorch, the EFA libraries with the aws-ofi-nccl plugin (NCCL over
# EFA), and this project with its `runtime` extra. The platform's MLflow server runs on it too (`tracking-server`:
# MLflow at the chart's appVersion and trainforge's auth app). `pulumi up` builds and pushes it (infra/registry.py); by hand,
# scripts/build-image. The build context is what .dockerignore admits: IMAGE_CONTEXT in infra/registry.py.
#
# The base's torch must satisfy pyproject.toml's runtime range (tests/test_image.py checks TORCH_VERSION against it).
ARG TORCH_VERSION=2.13.0
ARG CUDA_TAG=cuda12.8-cudnn9-runtime
FROM pytorch/pytorch:${TORCH_VERSION}-${CUDA_TAG}

ARG EFA_INSTALLER_VERSION=1.43.1
ARG TORCH_VERSION
# MLFLOW_DISABLE_TELEMETRY: MLflow 3 reports usage to its makers by default, from every worker and from the server;
# the platform's pods talk to the platform (and S3, the registry), not out.
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    MLFLOW_DISABLE_TELEMETRY=true \
    PIP_NO_CACHE_DIR=1 \
    NCCL_SOCKET_IFNAME=^lo,docker \
    LD_LIBRARY_PATH=/opt/amazon/aws-ofi-nccl/lib:/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:/opt/amazon/openmpi/lib:${LD_LIBRARY_PATH}

# FI_PROVIDER and FI_EFA_USE_DEVICE_RDMA are not set here: the rendered pod sets them where it gets EFA devices, RDMA
# only on types that have it (trainer/render.py efa_env); the runtime then checks NCCL's OFI plugin is there.
# EFA user-space (libfabric) and the aws-ofi-nccl plugin, container mode: no kernel module (the node's AMI has it),
# no ulimit changes (set per pod), no device check (lspci does not work in a build).
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl git \
 && mkdir -p /tmp/efa && cd /tmp/efa \
 && curl -fsSLO https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz \
 && tar -xf aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz && cd aws-efa-installer \
 && ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify \
 && cd / && rm -rf /tmp/efa /var/lib/apt/lists/*

# The project, from pyproject.toml (no second list of requirements). The base's torch satisfies the runtime range,
# so pip keeps it instead of resolving another build. Python is the base's own, on purpose: torch's CUDA build is made
# for it, and a second interpreter would mean a second torch. pip refuses it if it leaves requires-python (>=3.11; the
# package is tested on 3.11 and 3.13), and the build prints it.
WORKDIR /workspace
COPY pyproject.toml README.md ./
COPY src ./src
COPY infra ./infra
COPY platform ./platform
COPY policies ./policies
COPY trainer ./trainer
RUN python -m pip install ".[runtime,tracking-server]" \
 && python -c "import sys, torch, trainforge.trainer.runtime.loop; print('python', sys.version.split()[0], 'torch', torch.__version__)"

# The digest of the build context (infra/registry.py context_digest; the program and scripts/build-image pass it): the
# runs record it as their code version. Not the commit: the same sources must build the same content tag.
ARG SOURCE_DIGEST=unknown
ENV TRAINFORGE_SOURCE_DIGEST=${SOURCE_DIGEST}

RUN useradd --create-home --uid 1000 --user-group trainer && chown -R trainer:trainer /workspace
USER 1000:1000

# The node launcher: runs torchrun and exits with the contract's code (render.py emits the same command).
ENTRYPOINT ["python", "-m", "trainforge.trainer.launch"]
