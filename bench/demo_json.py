"""Running a lesson's demo for its numbers: demo --json, read back.

run_demo(script, demo, flags, json_path) runs `demo flags --json json_path`
with its table discarded, and returns the JSON it wrote (the schema is
report_json's in common/src/train/demo.cc). A demo that fails ends the
calling script with the demo's exit code and the end of its output, under
the script's name.
"""
import json
import subprocess
import sys


def run_demo(script, demo, flags, json_path):
    cmd = [demo] + flags + ["--json", json_path]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit(f"{script}: {' '.join(cmd)} failed with exit code {done.returncode}:\n"
                 + done.stdout[-3000:])
    with open(json_path) as f:
        return json.load(f)
