# syntax=docker/dockerfile:1
# ctxproxy image: docker build -t ctxproxy . && docker run -p 8787:8787 -e CTXPROXY_UPSTREAM=… ctxproxy
#
# Two stages. The build stage makes a virtualenv holding ctxproxy, its dependencies and litellm
# *without* litellm's dependency tree (boto3, tokenizers, pydantic, openai…: the proxy never imports
# litellm, it reads two of its data files), then deploy/slim_litellm.py cuts litellm to those files and
# fails the build if the proxy could not find them. The runtime stage copies the virtualenv alone.
# Measured on the same steps: about 65 MB of site-packages instead of about 550 MB.
#
# Every setting is a CTXPROXY_* environment variable (README, "Configuration"). Default store: SQLite
# in /data; mount a volume there, or set CTXPROXY_STORE=redis://… for several replicas.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/ctxproxy/bin:$PATH
RUN python -m venv /opt/ctxproxy
WORKDIR /src
COPY pyproject.toml README.md ./
# Dependencies first, from pyproject.toml, so this layer is cached until they change; litellm apart.
RUN python -c "import re, tomllib; \
deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; \
is_litellm = lambda d: re.split(r'[^A-Za-z0-9._-]', d, maxsplit=1)[0].lower() == 'litellm'; \
open('deps.txt', 'w').write('\n'.join(d for d in deps if not is_litellm(d))); \
open('litellm.txt', 'w').write('\n'.join(d for d in deps if is_litellm(d)))" \
 && pip install -r deps.txt \
 && pip install --no-deps -r litellm.txt
COPY proxy ./proxy
COPY deploy/slim_litellm.py ./
RUN pip install --no-deps . \
 && python slim_litellm.py \
 && pip uninstall --yes pip setuptools

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/ctxproxy/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    LITELLM_LOCAL_MODEL_COST_MAP=True \
    CTXPROXY_HOST=0.0.0.0 \
    CTXPROXY_PORT=8787 \
    CTXPROXY_STORE=sqlite:////data/facts.db
RUN groupadd --system --gid 10001 ctxproxy \
 && useradd --system --uid 10001 --gid 10001 --home-dir /data --no-create-home --shell /usr/sbin/nologin ctxproxy \
 && mkdir /data && chown 10001:10001 /data
COPY --from=build /opt/ctxproxy /opt/ctxproxy
USER 10001:10001
WORKDIR /data
EXPOSE 8787
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; port = os.environ.get('CTXPROXY_PORT', '8787'); sys.exit(urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=2).status != 200)"]
ENTRYPOINT ["ctxproxy", "serve"]
