"""``make gpu-check`` (benchmarks/gpu_check.py) says PASS only for what ran: its verdicts on made-up
outputs of the programs it starts (``run_stamped`` replaced: no training runs), the node probe with a fake
``nvidia-smi``, the cuDNN layout probe in this process, and the tf backend's reduction probe in a real
2-rank mpirun job. No GPU exists here: the GPU mode is driven by made-up node facts."""
from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest

from helpers import ROOT, child_env, run_mpi

sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks import each other as scripts do

import gpu_check  # noqa: E402
import timing  # noqa: E402

TF_LOG = ("tf backend: CPU tensors reduced by RING, GPU tensors by {hint} (distributed_tf_gpu_reduction)\n"
          "distributed: using the tf backend (distributed_backend = 'tf'); 2 ranks\n")
MPI_LOG = "distributed: using the mpi backend (distributed_backend = 'mpi'); 2 ranks\n"
FRAMES = {"12ax_compute": 900, "12ax_cpu": 300, "blstm_cudnn": 50000, "blstm_cpu": 1000,
          "blstm_native": 9000, "blstm_mixed": 90000}
LAYOUT_OK = ("lstm-layout: vector equal: the engine's cuDNN parameter vector against Keras' (max |diff| 0)\n"
             "lstm-layout: outputs equal: the engine's LSTM through the twin against Keras' (max |diff| "
             "2e-07 on valid frames)\n")


def probe_lines(ranks: int, device: str, hint: str, result: str = "sum exact") -> str:
    return "".join(f"collective-probe: rank {r} of {ranks}: 1 CollectiveReduceV2 on /job:worker/"
                   f"replica:0/task:{r}/device:{device}:0 (communication_hint {hint}): {result}\n"
                   for r in range(ranks))


class FakeRuns:
    """Stands for ``run_stamped``: answers each command as the program would, and records it."""

    def __init__(self, failing: tuple[str, ...] = (), collective=None, layout: str = LAYOUT_OK):
        self.commands: list[tuple[list[str], dict]] = []
        self.failing, self.collective, self.layout = failing, collective, layout

    def __call__(self, cmd, env, timeout=1800, check=True):
        self.commands.append((cmd, env))
        joined = " ".join(cmd)
        if "collective_probe.py" in joined:
            text, code = (self.collective or self.honest_probe)(cmd, env)
        elif "lstm_layout_probe.py" in joined:
            text, code = self.layout, 0 if "DIFFERENT" not in self.layout else 1
        else:
            text, code = self.training(re.search(r"/(\w+)-\d+/model", joined).group(1), joined)
        return timing.Output(text, [], code)

    @staticmethod
    def honest_probe(cmd, env):
        ranks = int(cmd[cmd.index("-np") + 1])
        device = cmd[cmd.index("--device") + 1].upper()
        hint = cmd[cmd.index("--gpu-reduction") + 1] if device == "GPU" else "ring"
        banner = "NCCL version 2.18.3+cuda12.2\n" if env.get("NCCL_DEBUG") == "VERSION" and hint == "nccl" \
            and ranks > 1 else ""
        return TF_LOG.format(hint=hint.upper()) + banner + probe_lines(ranks, device, hint), 0

    def training(self, name: str, joined: str) -> tuple[str, int]:
        if name in self.failing:
            return "Traceback (most recent call last):\nRuntimeError: it broke\n", 1
        hint = "RING" if "++distributed_tf_gpu_reduction ring" in joined else "NCCL"
        log = MPI_LOG if "distributed_backend mpi" in joined else TF_LOG.format(hint=hint)
        frames = FRAMES.get(name, 1000)
        return (f"{log}train epoch 1: {frames * 0.9:.1f} frames/sec (10 frames)\n"
                f"train epoch 2: {frames:.1f} frames/sec (10 frames)\ndev: score 1.000000 error 0.500000\n"
                "peak GPU memory rank 0: 2048.0 MiB\n"), 0


def run_check(monkeypatch, capsys, tmp_path, fake: FakeRuns, *args: str) -> tuple[int, list[str]]:
    monkeypatch.setattr(gpu_check, "run_stamped", fake)
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--keep", str(tmp_path), *args])
    code = gpu_check.main()
    return code, capsys.readouterr().out.splitlines()


def gpu_node(monkeypatch, gpus: int) -> None:
    from gpu_node import NodeFacts

    facts = NodeFacts(smi_found=True, smi_gpus=tuple(f"{i}, NVIDIA H100, 550.54" for i in range(gpus)),
                      tf_version="2.15.1", built_with_cuda=True, tf_gpus=gpus, capability=9)
    monkeypatch.setattr(gpu_check, "read_facts", lambda: facts)


def test_dry_mode_judges_nothing_it_cannot(monkeypatch, capsys, tmp_path):
    """No GPU: the speed targets, cuDNN's kernel, NCCL and peak GPU memory are DRY lines, never PASS; the
    tf backend's ring is judged between 2 CPU ranks by its result; the last line names what was not
    checked and the exit is 0."""
    fake = FakeRuns()
    code, lines = run_check(monkeypatch, capsys, tmp_path, fake, "--dry")
    assert code == 0, lines
    judged_gpu = [line for line in lines if line.startswith("PASS") and re.search("NCCL|GPU|cuDNN", line)]
    assert not judged_gpu, lines
    assert len([line for line in lines if line.startswith("DRY: ") and "nothing judged" in line]) == 3, lines
    assert any(line.startswith("DRY: cuDNN's kernel") for line in lines), lines
    assert any(line.startswith("DRY: the tf backend with NCCL") for line in lines), lines
    assert "PASS: tf backend, its ring between 2 CPU ranks: each of 2 rank(s) got the exact sum on its CPU " \
           "(ring)" in lines
    assert lines[-1] == ("gpu-check: DRY mode, all checks PASS (on the CPU); not checked: the speed targets, "
                         "cuDNN's kernel, NCCL, peak GPU memory")
    probes = [cmd for cmd, _ in fake.commands if "collective_probe.py" in " ".join(cmd)]
    assert len(probes) == 1 and probes[0][probes[0].index("-np") + 1] == "2" and "cpu" in probes[0]


@pytest.mark.parametrize("case", ["log line only", "a wrong sum", "one rank silent"])
def test_the_tf_backend_passes_only_on_a_checked_result(monkeypatch, capsys, tmp_path, case):
    """The backend's start-up line ("GPU tensors by RING"), printed before any collective, is no evidence:
    without every rank's exact sum the line is FAIL and the exit non-zero."""
    outputs = {"log line only": TF_LOG.format(hint="RING"),
               "a wrong sum": probe_lines(2, "CPU", "ring").replace(
                   "rank 1 of 2: 1 CollectiveReduceV2", "rank 1 of 2: WRONG: the sum is wrong; x"),
               "one rank silent": probe_lines(2, "CPU", "ring").splitlines()[0]}
    fake = FakeRuns(collective=lambda cmd, env: (TF_LOG.format(hint="RING") + outputs[case], 0))
    code, lines = run_check(monkeypatch, capsys, tmp_path, fake, "--dry")
    assert code == 1, lines
    failed = [line for line in lines if line.startswith("FAIL: tf backend, its ring between 2 CPU ranks")]
    assert len(failed) == 1 and "no exact sum on the CPU with ring from rank(s)" in failed[0], lines
    assert lines[-1] == ("gpu-check: DRY mode, 1 check(s) not PASS; not checked: the speed targets, cuDNN's "
                         "kernel, NCCL, peak GPU memory")


def test_a_gpu_node_runs_nccl_with_a_rank_per_gpu_and_the_ring_on_one_shared_gpu(monkeypatch, capsys,
                                                                                 tmp_path):
    gpu_node(monkeypatch, 4)
    fake = FakeRuns()
    code, lines = run_check(monkeypatch, capsys, tmp_path, fake, "--runs", "3")
    assert code == 0, lines
    assert ("PASS: tf backend, NCCL between the 4 GPUs TensorFlow sees (one rank per GPU): each of 4 rank(s) "
            "got the exact sum on its GPU (nccl; NCCL 2.18.3+cuda12.2 ran)") in lines
    assert ("PASS: tf backend, its ring between 2 ranks sharing one GPU: each of 2 rank(s) got the exact sum "
            "on its GPU (ring)") in lines
    assert lines[-1] == "gpu-check: all checks PASS", lines
    assert not [line for line in lines if line.startswith(("DRY", "NOT CHECKED"))], lines
    by_program = {}
    for cmd, env in fake.commands:
        model = re.search(r"/(\w+)-\d+/model", " ".join(cmd))
        by_program[model.group(1) if model else "nccl" if "nccl" in cmd else "ring" if "ring" in cmd else
                   "layout"] = (cmd, env)
    assert by_program["layout"][0][-1] == "gpu"
    nccl = by_program["nccl"]
    assert nccl[0][nccl[0].index("-np") + 1] == "4" and nccl[1]["NCCL_DEBUG"] == "VERSION"
    assert "CUDA_VISIBLE_DEVICES" not in nccl[1] or nccl[1]["CUDA_VISIBLE_DEVICES"] != "0"
    for name in ("ring", "mpi_2ranks", "tf_2ranks"):  # 2 ranks that share one GPU, not one GPU each
        cmd, env = by_program[name]
        assert cmd[cmd.index("-np") + 1] == "2" and env["CUDA_VISIBLE_DEVICES"] == "0", name


def test_nccl_that_did_not_run_fails(monkeypatch, capsys, tmp_path):
    """Exact sums but no word from NCCL (it prints its version when it sets up, NCCL_DEBUG=VERSION): the
    reduction went another way, and the NCCL line says FAIL."""
    gpu_node(monkeypatch, 2)
    fake = FakeRuns(collective=lambda cmd, env: (probe_lines(int(cmd[cmd.index("-np") + 1]), "GPU",
                                                             cmd[cmd.index("--gpu-reduction") + 1]), 0))
    code, lines = run_check(monkeypatch, capsys, tmp_path, fake, "--runs", "3")
    assert code == 1
    assert [line for line in lines if line.startswith("FAIL: tf backend, NCCL between the 2 GPUs")
            and "NCCL printed no version line" in line], lines


def test_a_one_gpu_node_says_nccl_between_ranks_was_not_checked(monkeypatch, capsys, tmp_path):
    gpu_node(monkeypatch, 1)
    code, lines = run_check(monkeypatch, capsys, tmp_path, FakeRuns(), "--runs", "3")
    assert code == 0, lines
    assert ("PASS: tf backend, its GPU reduction on 1 rank (communication hint nccl): each of 1 rank(s) got "
            "the exact sum on its GPU (nccl)") in lines
    assert any(line.startswith("NOT CHECKED: NCCL between ranks: this node has 1 GPU") for line in lines)
    assert lines[-1] == ("gpu-check: all checks PASS; not checked: NCCL between ranks (this node has 1 GPU; "
                         "NCCL takes one rank per GPU)")


def test_a_gpu_that_tensorflow_cannot_use_fails_with_its_cause(monkeypatch, capsys, tmp_path):
    """nvidia-smi lists a GPU, this environment's TensorFlow (asked for real, in a child) sees none: one
    FAIL line naming the GPU and the cause, exit 1, no dry run (nothing else is started)."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    smi = fake_bin / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA H100 80GB HBM3, 550.54.15'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}{os.pathsep}{os.environ['PATH']}")

    def no_run(cmd, env, timeout=1800, check=True):
        raise AssertionError(f"gpu-check started {cmd} on a node whose GPU TensorFlow cannot use")

    code, lines = run_check(monkeypatch, capsys, tmp_path, no_run)
    assert code == 1, lines
    assert lines[0].startswith("FAIL: this node has a GPU (nvidia-smi lists 1 GPU(s) (0, NVIDIA H100 80GB "
                               "HBM3, 550.54.15)) but TensorFlow sees none: "), lines
    assert re.search(r"is not built with CUDA \(a CPU-only wheel|is built with CUDA \S* but finds no GPU: a "
                     r"CUDA/driver mismatch", lines[0]), lines
    assert lines[-1] == "gpu-check: 1 check(s) not PASS (the GPU cannot be used)"


def test_each_cause_is_named():
    from gpu_node import NodeFacts, decide

    smi = dict(smi_found=True, smi_gpus=("0, NVIDIA A100, 470.82",), tf_version="2.15.1")
    assert decide(NodeFacts())[0] == "dry"
    assert decide(NodeFacts(device_files=("/dev/nvidia0",), tf_gpus=1))[0] == "gpu"
    causes = {
        "TensorFlow does not import here (ImportError: libcudart.so.12: cannot open shared object file)":
            NodeFacts(**{**smi, "tf_version": ""},
                      tf_error="ImportError: libcudart.so.12: cannot open shared object file"),
        "this TensorFlow 2.15.1 is not built with CUDA (a CPU-only wheel": NodeFacts(**smi),
        "CUDA_VISIBLE_DEVICES='' hides every GPU": NodeFacts(**smi, built_with_cuda=True, visible_devices=""),
        "the NVIDIA driver does not answer (nvidia-smi: NVIDIA-SMI has failed": NodeFacts(
            smi_found=True, smi_error="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
            "driver", built_with_cuda=True, tf_version="2.15.1"),
        "TensorFlow 2.15.1 is built with CUDA 12.2 but finds no GPU: a CUDA/driver mismatch (the driver is "
        "older than that CUDA needs) or CUDA libraries that do not load; TensorFlow said: failed call to "
        "cuInit: CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE": NodeFacts(
            **smi, built_with_cuda=True, cuda_version="12.2",
            tf_messages=("failed call to cuInit: CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",)),
        "the device file(s) /dev/nvidia0 exist": NodeFacts(device_files=("/dev/nvidia0",)),
    }
    for cause, facts in causes.items():
        mode, why = decide(facts)
        assert mode == "fail" and cause in why and "TensorFlow sees none" in why, (cause, why)


def test_a_failed_12ax_row_is_a_failure(monkeypatch, capsys, tmp_path):
    code, lines = run_check(monkeypatch, capsys, tmp_path, FakeRuns(failing=("12ax_compute",)), "--dry")
    assert code == 1, lines
    failed = [line for line in lines if line.startswith("FAIL: 12AX frames/s on the cpu against the 2-core "
                                                        "CPU:")]
    assert len(failed) == 1 and "12ax_compute: 12ax_compute exited 1" in failed[0], lines
    assert not [line for line in lines if line.startswith("INFO: 12AX")], lines


def test_a_layout_difference_fails_the_cudnn_line(monkeypatch, capsys, tmp_path):
    layout = LAYOUT_OK.replace("vector equal", "vector DIFFERENT")
    code, lines = run_check(monkeypatch, capsys, tmp_path, FakeRuns(layout=layout), "--dry")
    assert code == 1
    assert [line for line in lines if line.startswith("FAIL: cuDNN's layout: exit 1: vector DIFFERENT")], \
        lines


def test_the_layout_probe_sees_a_layout_error_that_the_twin_cannot(monkeypatch):
    """A layout error that the engine's writing and its twin's reading share (here: blocks not transposed)
    leaves the twin equal to the engine's own LSTM, the dry mode's speed rows would not notice; Keras'
    vector for cuDNN differs."""
    import tensorflow as tf

    import lstm_layout_probe
    from engine.model.layers import lstm_cudnn
    from engine.model.layers.lstm import fused_lstm

    assert lstm_layout_probe.compare("cpu")[0] == 0 and lstm_layout_probe.compare("cpu")[1] < 1e-5

    def params_untransposed(weights, bias, n_in, n_out):
        gates_in, gates_re = tf.split(weights[:n_in], 4, axis=1), tf.split(weights[n_in:], 4, axis=1)
        blocks = [tf.reshape(gates_in[g], [-1]) for g in lstm_cudnn.CUDNN_GATES]
        blocks += [tf.reshape(gates_re[g], [-1]) for g in lstm_cudnn.CUDNN_GATES]
        biases = [tf.zeros([4 * n_out])] + [tf.split(bias, 4)[g] for g in lstm_cudnn.CUDNN_GATES]
        return tf.concat(blocks + biases, 0)

    def unpack_untransposed(params, n_in, n_out):
        parts = tf.split(params, [n_out * n_in] * 4 + [n_out * n_out] * 4 + [n_out] * 8)
        kernel = tf.concat([tf.reshape(p, [n_in, n_out]) for p in parts[:4]], axis=1)
        recurrent = tf.concat([tf.reshape(p, [n_out, n_out]) for p in parts[4:8]], axis=1)
        return kernel, recurrent, tf.concat(parts[8:12], 0) + tf.concat(parts[12:], 0)

    monkeypatch.setattr(lstm_cudnn, "cudnn_params", params_untransposed)
    monkeypatch.setattr(lstm_cudnn, "_unpack", unpack_untransposed)
    rng = np.random.RandomState(0)
    x = tf.constant(rng.randn(6, 2, 3).astype(np.float32))
    weights = tf.constant(rng.randn(7, 16).astype(np.float32))
    bias = tf.constant(rng.randn(16).astype(np.float32))
    lengths = tf.constant([6, 6])
    twin, ours = lstm_cudnn.cudnn_twin(x, lengths, weights, bias, 4), fused_lstm(x, lengths, weights, bias, 4)
    np.testing.assert_allclose(twin.numpy(), ours.numpy(), rtol=1e-5, atol=1e-6)  # the twin cannot see it
    vector_diff, output_diff = lstm_layout_probe.compare("cpu")
    assert vector_diff > 0.1 and output_diff < 1e-5  # Keras' vector can


@pytest.mark.mpi
@pytest.mark.slow
def test_the_collective_probe_checks_a_real_reduction():
    """2 ranks of the probe in a real mpirun job, on the CPU: each gets the exact sum through the tf
    backend's ring, and gpu_check's verdict on that output is PASS."""
    result = run_mpi(2, [str(ROOT / "benchmarks" / "collective_probe.py"), "--device", "cpu"],
                     timeout=240, env=child_env())
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    verdict = gpu_check.reduction_verdict("ring", output, result.returncode, 2, "CPU", "ring")
    assert verdict == "PASS: ring: each of 2 rank(s) got the exact sum on its CPU (ring)", output


def test_the_collective_probe_knows_a_wrong_sum():
    import collective_probe as probe

    for size in (1, 2, 3, 8):
        total = sum(probe.contribution(rank) for rank in range(size))
        assert probe.describe_difference(total, probe.expected_sum(size)) == ""
    missing_one = sum(probe.contribution(rank) for rank in range(2))  # rank 2 of 3 did not take part
    assert probe.describe_difference(missing_one, probe.expected_sum(3)).startswith(
        f"{probe.LENGTH} of {probe.LENGTH} elements differ (element 0: 3, expected 6)")
