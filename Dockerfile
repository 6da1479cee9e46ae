# evald: `docker build -t evald:local .` then `docker run evald:local run --bootstrap-servers kafka:9092 ...`
# Build a wheel in a throw-away stage so the runtime image carries no build tooling or sources.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY evald ./evald
RUN pip install --no-cache-dir --upgrade pip \
 && pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
# Every EVALD_<SECTION>__<FIELD> variable is a setting and beats any settings file, so the image
# sets none: its defaults (listen on 0.0.0.0:9464) come from a settings file that `--config`
# replaces. The healthcheck URL deliberately has another prefix.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    EVALD_CONFIG=/etc/evald/evald.yaml \
    HEALTHCHECK_URL=http://127.0.0.1:9464/healthz
COPY deploy/docker/evald.yaml /etc/evald/evald.yaml
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl \
 && rm -rf /wheels \
 && groupadd --system --gid 10001 evald \
 && useradd --system --uid 10001 --gid evald --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin evald
USER 10001:10001
WORKDIR /tmp
EXPOSE 9464
# No curl in slim images: probe /healthz with the Python that is already there.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['HEALTHCHECK_URL'], timeout=4)"]
ENTRYPOINT ["evald"]
CMD ["run"]
