"""A longer run of the lease-machine model (tests/test_lease_model.py).

make test explores 25 examples of 40 steps with a fixed seed; this runs
``--examples`` (default 150) of ``--steps`` (80) with fresh random choices
against the same real database and API, and prints the seed-free summary
``model examples=N steps=S result=passed seconds=T`` last. On a failure
Hypothesis prints the shortest sequence of steps it found that breaks an
invariant, and the exit status is 1.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=150)
    parser.add_argument("--steps", type=int, default=80)
    args = parser.parse_args()
    env = {**os.environ, "FLEETHQ_MODEL_EXAMPLES": str(args.examples),
           "FLEETHQ_MODEL_STEPS": str(args.steps), "FLEETHQ_MODEL_RANDOM": "1"}
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_lease_model.py"], cwd=ROOT, env=env)
    result = "passed" if done.returncode == 0 else "failed"
    print(f"model examples={args.examples} steps={args.steps} result={result} "
          f"seconds={time.monotonic() - began:.0f}")
    return 0 if done.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
