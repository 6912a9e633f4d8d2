# evsched's image for docker-compose: the package, its schemas and the example app.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md CHANGELOG.md ./
COPY src ./src
COPY schemas ./schemas
COPY projections ./projections
COPY examples ./examples
RUN pip install --no-cache-dir . && useradd --create-home evsched && mkdir /data \
    && chown evsched /data
USER evsched
ENV PYTHONPATH=/app
ENTRYPOINT ["evsched"]
