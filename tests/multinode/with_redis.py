#!/usr/bin/env python3
"""Runs a command next to a redis-server of its own, then stops the server.

    with_redis.py COMMAND [ARGS...]

Starts redis-server on a free loopback port (no persistence), in a process
group of its own, waits until it answers, runs COMMAND with TP_TEST_REDIS=
127.0.0.1:PORT in its environment, then kills the server's process group,
whatever COMMAND did, and exits with COMMAND's exit code. Exits 77 (meson's
SKIPPED) when redis-server is not installed, saying so: never a pass.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    # meson ends a test that times out (or a ./kit test that is stopped) with
    # SIGTERM; by default Python would die without its `finally`, leaving the
    # server (in a session of its own) running. Exit through it instead.
    signal.signal(signal.SIGTERM, lambda sig, frame: sys.exit(128 + sig))
    server = shutil.which("redis-server")
    if server is None:
        print("SKIPPED: redis-server is not installed (Debian package redis-server; "
              "./kit installs it)")
        return 77
    port = free_port()
    redis = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1",
                              "--save", "", "--appendonly", "no"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        for _ in range(200):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                time.sleep(0.05)
        else:
            print(f"redis-server did not answer on port {port} within 10 s")
            return 1
        env = dict(os.environ, TP_TEST_REDIS=f"127.0.0.1:{port}")
        return subprocess.run(sys.argv[1:], env=env).returncode
    finally:
        os.killpg(redis.pid, signal.SIGKILL)
        redis.wait()


if __name__ == "__main__":
    sys.exit(main())
