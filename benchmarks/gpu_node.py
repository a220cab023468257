"""Whether ``make gpu-check`` runs on a GPU, in its dry mode, or stops: what the node has and what
TensorFlow in this environment makes of it.

A node has an NVIDIA GPU when ``nvidia-smi`` is on ``PATH`` or a device file ``/dev/nvidiaN`` exists
(the driver makes one per GPU; TensorFlow cannot use a GPU without it). On such a node TensorFlow is
asked in a child process (so that the check itself holds no GPU memory): does it import, is it built
with CUDA, which GPUs does it see. Three outcomes (``decide``):

- the node has no GPU: the dry mode on the CPU (``dry``; TensorFlow is not asked);
- TensorFlow sees a GPU: the checks run on it (``gpu``);
- the node has a GPU that TensorFlow does not see: ``fail``, naming the cause (TensorFlow does not import;
  a CPU-only TensorFlow; ``CUDA_VISIBLE_DEVICES`` hiding every GPU; the driver not answering; a CUDA build
  that finds no GPU: driver and CUDA do not match, or its CUDA libraries do not load). Never a dry run:
  a dry run on such a node would end "PASS" and prove nothing about its GPU.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from timing import child_env

DEVICE_FILES = "/dev/nvidia[0-9]*"
SMI_QUERY = ["--query-gpu=index,name,driver_version", "--format=csv,noheader"]
# TensorFlow's own lines about why it found no GPU (its INFO lines are filtered out)
TF_CUDA_LINES = re.compile(r"cuInit|CUDA_ERROR|driver|dlopen|libcuda|libcudnn|libcudart|GPU will not be "
                           "used")

TF_PROBE = """
import json
try:
    import tensorflow as tf
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}))
    raise SystemExit(0)
gpus = tf.config.list_physical_devices("GPU")
details = tf.config.experimental.get_device_details(gpus[0]) if gpus else {}
build = tf.sysconfig.get_build_info()
print(json.dumps({"version": tf.__version__, "cuda": tf.test.is_built_with_cuda(), "gpus": len(gpus),
                  "major": details.get("compute_capability", (0, 0))[0],
                  "cuda_version": build.get("cuda_version", "")}))
"""


@dataclass(frozen=True)
class NodeFacts:
    """What the node has (``nvidia-smi``, device files) and what TensorFlow sees."""

    smi_found: bool = False
    smi_gpus: tuple[str, ...] = ()  # "index, name, driver version" per GPU, as nvidia-smi lists them
    smi_error: str = ""  # nvidia-smi is there but fails: its message
    device_files: tuple[str, ...] = ()
    tf_error: str = ""  # TensorFlow does not import, or its probe failed: why
    tf_version: str = ""
    built_with_cuda: bool = False
    cuda_version: str = ""
    tf_gpus: int = 0
    capability: int = 0  # the first GPU's compute capability, major
    tf_messages: tuple[str, ...] = field(default=())  # TensorFlow's own lines about CUDA
    visible_devices: str | None = None  # CUDA_VISIBLE_DEVICES

    @property
    def node_has_gpu(self) -> bool:
        return self.smi_found or bool(self.device_files)

    def evidence(self) -> str:
        """Why the node counts as a GPU node, in words."""
        if self.smi_gpus:
            return f"nvidia-smi lists {len(self.smi_gpus)} GPU(s) ({'; '.join(self.smi_gpus)})"
        if self.smi_found:
            return f"nvidia-smi is installed but fails ({self.smi_error or 'it lists no GPU'})"
        return f"the device file(s) {', '.join(self.device_files)} exist"


def read_facts(env: dict | None = None, device_pattern: str = DEVICE_FILES) -> NodeFacts:
    """The facts of this node; ``env`` is the environment of the probes (its ``PATH`` finds nvidia-smi)."""
    env = dict(os.environ if env is None else env)
    smi = shutil.which("nvidia-smi", path=env.get("PATH", ""))
    smi_gpus: tuple[str, ...] = ()
    smi_error = ""
    if smi:
        try:
            out = subprocess.run([smi, *SMI_QUERY], capture_output=True, text=True, timeout=60)
            lines = tuple(line.strip() for line in out.stdout.splitlines() if line.strip())
            if out.returncode == 0:
                smi_gpus = lines
            else:
                smi_error = " ".join([*lines, *out.stderr.split()])[:300] or f"exit {out.returncode}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            smi_error = f"{type(exc).__name__}: {exc}"
    device_files = tuple(sorted(glob.glob(device_pattern)))
    if not smi and not device_files:
        return NodeFacts(visible_devices=env.get("CUDA_VISIBLE_DEVICES"))
    probe_env = child_env(extra={"TF_CPP_MIN_LOG_LEVEL": "1", "PATH": env.get("PATH", "")})
    for key in ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH"):
        probe_env.pop(key, None)
        if key in env:
            probe_env[key] = env[key]
    out = subprocess.run([sys.executable, "-c", TF_PROBE], capture_output=True, text=True, env=probe_env)
    messages = tuple(line.strip() for line in out.stderr.splitlines() if TF_CUDA_LINES.search(line))[:4]
    found = [line for line in out.stdout.splitlines() if line.startswith("{")]
    tf: dict = json.loads(found[-1]) if found and out.returncode == 0 else {}
    if not tf:
        tail = [line for line in out.stderr.splitlines() if line.strip()][-3:]
        tf = {"error": f"the probe exited {out.returncode}: {' | '.join(tail) or 'no output'}"}
    return NodeFacts(smi_found=bool(smi), smi_gpus=smi_gpus, smi_error=smi_error,
                     device_files=device_files, tf_error=tf.get("error", ""),
                     tf_version=tf.get("version", ""), built_with_cuda=bool(tf.get("cuda")),
                     cuda_version=tf.get("cuda_version", ""), tf_gpus=int(tf.get("gpus", 0)),
                     capability=int(tf.get("major", 0)), tf_messages=messages,
                     visible_devices=env.get("CUDA_VISIBLE_DEVICES"))


def hides_every_gpu(visible: str | None) -> bool:
    """Whether ``CUDA_VISIBLE_DEVICES`` leaves CUDA no device ("" or a list starting with -1)."""
    return visible is not None and (not visible.strip() or visible.split(",")[0].strip() == "-1")


def decide(facts: NodeFacts) -> tuple[str, str]:
    """("gpu" | "dry" | "fail", why): where the checks run, or why they cannot."""
    if not facts.node_has_gpu:
        return "dry", "no GPU on this node: no nvidia-smi on PATH, no /dev/nvidiaN"
    if facts.tf_gpus > 0:
        return "gpu", f"TensorFlow {facts.tf_version} sees {facts.tf_gpus} GPU(s)"
    if facts.tf_error:
        cause = f"TensorFlow does not import here ({facts.tf_error})"
    elif not facts.built_with_cuda:
        cause = (f"this TensorFlow {facts.tf_version} is not built with CUDA (a CPU-only wheel such as "
                 "tensorflow-cpu): install the CUDA build, `make install GPU=1` (or `make install-latest "
                 "GPU=1`)")
    elif hides_every_gpu(facts.visible_devices):
        cause = (f"CUDA_VISIBLE_DEVICES={facts.visible_devices!r} hides every GPU: unset it, or name the "
                 "GPUs to check")
    elif facts.smi_error:
        cause = f"the NVIDIA driver does not answer (nvidia-smi: {facts.smi_error})"
    else:
        said = f"; TensorFlow said: {' | '.join(facts.tf_messages)}" if facts.tf_messages else ""
        cause = (f"TensorFlow {facts.tf_version} is built with CUDA {facts.cuda_version or '?'} but finds "
                 "no GPU: a CUDA/driver mismatch (the driver is older than that CUDA needs) or CUDA "
                 f"libraries that do not load{said}")
    return "fail", (f"this node has a GPU ({facts.evidence()}) but TensorFlow sees none: {cause}. Nothing "
                    "else was checked: a dry run would prove nothing about this node (--dry forces one)")
