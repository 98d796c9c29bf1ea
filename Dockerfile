# One image for every lab part in compose.yaml: the reference server, mitmdump with the
# addon, the Locust master and workers, `lab prepare`, `lab watch` and `lab report`.
# lab is installed as a wheel (not editable): scenarios and addons come with it as
# package data. The sources stay in /lab, where compose.yaml's mitmdump and Locust
# commands name the addon and the locustfile.
FROM python:3.12-slim
WORKDIR /lab
COPY pyproject.toml setup.py constraints.txt README.md ./
COPY lab ./lab
COPY dashboards ./dashboards
COPY addons ./addons
COPY scenarios ./scenarios
RUN pip install --no-cache-dir -c constraints.txt .
ENV PYTHONUNBUFFERED=1
