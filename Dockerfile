# syntax=docker/dockerfile:1
# Multi-stage: build a wheel set in one stage, install it into a slim runtime as a non-root user.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proxy ./proxy
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 \
    LITELLM_LOCAL_MODEL_COST_MAP=True \
    CTXPROXY_HOST=0.0.0.0 \
    CTXPROXY_STORE=sqlite:////data/facts.db
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
    && useradd --system --uid 10001 --home-dir /data ctxproxy && mkdir -p /data && chown ctxproxy /data
USER ctxproxy
VOLUME /data
EXPOSE 8787
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
    CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8787/healthz').status != 200)"
ENTRYPOINT ["ctxproxy", "serve"]
