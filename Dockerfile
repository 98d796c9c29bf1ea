# One image for every lab part in compose.yaml: the reference server, mitmdump with the
# addon, the Locust master and workers, `lab prepare` and `lab report`.
FROM python:3.12-slim
WORKDIR /lab
COPY pyproject.toml constraints.txt README.md ./
COPY lab ./lab
COPY dashboards ./dashboards
COPY addons ./addons
COPY scenarios ./scenarios
RUN pip install --no-cache-dir -c constraints.txt .
ENV PYTHONUNBUFFERED=1
