"""Show that the second CPU setting of `make test` changes PyTorch's float results bit for bit.

`make test` runs every notebook twice under nbval: natively, and under
``ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE``. The first variable makes PyTorch
use its plain (non-vectorised) kernels for softmax, exp, sums, GELU and LayerNorm; the
second makes MKL pick its portable matmul code path. Both change the order of float
operations, as another CPU would. This script computes a few ops in a child process
under each setting and prints, per op, whether the bits differ, so a reader can see
that the second nbval pass really tests something on their machine.

    python tools/cpu_settings.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

SECOND_SETTING = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}

_PROBE = """
import hashlib, json, torch
torch.manual_seed(0)
torch.set_num_threads(1)
x, w = torch.randn(64, 333), torch.randn(333, 517)
ops = {"matmul": x @ w, "softmax": torch.softmax(x, -1), "exp": x.exp(), "sum": x.sum(-1),
       "gelu": torch.nn.functional.gelu(x), "layer_norm": torch.nn.functional.layer_norm(x, (333,))}
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(),
                  **{k: hashlib.sha256(v.numpy().tobytes()).hexdigest()[:12] for k, v in ops.items()}}))
"""


def probe(extra_env: dict[str, str] | None = None) -> dict[str, str]:
    """Hashes of a few ops' float32 results, computed in a fresh process with ``extra_env``."""
    env = {k: v for k, v in os.environ.items() if k not in SECOND_SETTING}
    env.update(extra_env or {})
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    native, second = probe(), probe(SECOND_SETTING)
    setting = " ".join(f"{k}={v}" for k, v in SECOND_SETTING.items())
    print(f"native kernels: {native['capability']}; second setting ({setting}): "
          f"{second['capability']}")
    ops = [k for k in native if k != "capability"]
    differ = [k for k in ops if native[k] != second[k]]
    for k in ops:
        print(f"  {k:<10} {'bits differ' if k in differ else 'same bits'}")
    print(f"{len(differ)}/{len(ops)} ops give different bits under the second setting")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
