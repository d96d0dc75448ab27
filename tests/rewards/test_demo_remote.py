#!/usr/bin/env python3
"""`branchgrpo demo --remote-reward URL` against the in-process demo (tests/rewards/demo_remote.cmake; label rewards).

A short dance run of the shipped shapes model twice: the alignment term in process, then through
scripts/reward_server.py's shapes_alignment scorer (the same formula in numpy) on a free loopback port. The server
gets float32 pixels and returns float64 scores, so every iteration's reward agrees to 1e-12 and the report names the
server. Then --remote-reward at a port nobody listens on is one line before any training, and --remote-scorer
without --remote-reward is refused.

Usage: test_demo_remote.py TOOL WORK_DIR
"""
import csv
import os
import shutil
import socket
import subprocess
import sys
import time

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHORT = ["--quick", "--methods", "dance", "--iters", "2", "--steps", "4", "--prompts", "1", "--quiet"]


def fail(message):
    sys.exit("FAIL: " + message)


def start_server(work):
    port_file = os.path.join(work, "port")
    server = subprocess.Popen(["/usr/bin/python3", "-B", os.path.join(SOURCE, "scripts", "reward_server.py"),
                               "--scorer", "shapes_alignment", "--host", "127.0.0.1", "--port", "0",
                               "--port-file", port_file])
    deadline = time.monotonic() + 30
    while not (os.path.exists(port_file) and open(port_file).read().strip()):
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            fail("the reward server did not start")
        time.sleep(0.05)
    return server, "http://127.0.0.1:" + open(port_file).read().strip()


def demo(tool, out, *extra):
    run = subprocess.run([tool, "demo", "--out", out, *SHORT, *extra], capture_output=True, text=True, timeout=300)
    return run.returncode, run.stdout, run.stderr


def rewards(out):
    with open(os.path.join(out, "demo.csv")) as f:
        return [float(row["reward_mean"]) for row in csv.DictReader(f)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(tool, work):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    status, _, err = demo(tool, os.path.join(work, "local"))
    if status:
        fail("in-process demo: " + err)
    server, url = start_server(work)
    try:
        status, _, err = demo(tool, os.path.join(work, "remote"), "--remote-reward", url,
                              "--remote-scorer", "shapes_alignment")
    finally:
        server.terminate()
        server.wait(timeout=30)
    if status:
        fail("remote demo: " + err)
    local, remote = rewards(os.path.join(work, "local")), rewards(os.path.join(work, "remote"))
    if len(local) != 2 or len(remote) != 2 or any(abs(a - b) > 1e-12 for a, b in zip(local, remote)):
        fail("rewards differ: in process %r, remote %r" % (local, remote))
    report = open(os.path.join(work, "remote", "report.md")).read()
    if "scored by the reward server at " + url + " (scorer shapes_alignment)" not in report:
        fail("the report does not name the server")

    dead = "http://127.0.0.1:%d" % free_port()
    status, _, err = demo(tool, os.path.join(work, "dead"), "--remote-reward", dead)
    lines = err.strip().splitlines()
    if status != 2 or len(lines) != 1 or "remote reward " + dead + "/info: " not in lines[0]:
        fail("a dead server: exit %d, %r" % (status, err))
    status, _, err = demo(tool, os.path.join(work, "scorer"), "--remote-scorer", "x")
    if status != 2 or "--remote-scorer = x: needs --remote-reward" not in err:
        fail("--remote-scorer alone: exit %d, %r" % (status, err))
    print("demo --remote-reward: ok (rewards %r)" % remote)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
