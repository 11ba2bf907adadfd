# syntax=docker/dockerfile:1
# curvecast service image: `curvecast serve` on port 8000. Multi-stage: the build stage
# installs the package and its [server] extra into a virtualenv; the runtime stage copies only
# that virtualenv onto a slim base and runs as an unprivileged user. No torch: the server does
# not need it.
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
# curvecast/ is the one installed package; its subpackages are symlinks (curvecast/service ->
# ../service, ...) that COPY keeps as links and the wheel build follows, so the folders they
# point to are copied beside it.
COPY curvecast ./curvecast
COPY service ./service
COPY client ./client
COPY sfplus ./sfplus
COPY dashboards ./dashboards
COPY migrations ./migrations
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install ".[server]"

FROM python:${PYTHON_VERSION}-slim AS runtime
RUN groupadd --system curvecast \
 && useradd --system --gid curvecast --home-dir /var/lib/curvecast --create-home curvecast
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    CURVECAST_DATABASE_URL=sqlite:////var/lib/curvecast/curvecast.db
USER curvecast
WORKDIR /var/lib/curvecast
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2).status != 200)"]
ENTRYPOINT ["curvecast", "serve"]
# A container listens on all interfaces, so auth must be on (CURVECAST_AUTH_ENABLED=true).
CMD ["--host", "0.0.0.0", "--port", "8000"]
