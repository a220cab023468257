"""Run under ``mpirun -np N``: the tf backend's checks in one job (one TensorFlow start-up): those of
``dist_collectives.py`` (exact results, against the mpi backend too), then with 2 ranks those of
``wire_reduce.py`` (fp16/bf16 against numpy references), then, given their arguments, the trainings of
``train_runs.py``. Each prints its own ``checks passed`` or ``run K done`` lines.

    python tf_backend_checks.py [OUT_DIR 'LIST_OF_CONFIG_DICT_LITERALS' [fail_rank=R fail_run=K]]
"""
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    from mpi4py import MPI

    runs = [("dist_collectives.py", ["--backend", "tf", "--compare-with", "mpi"])]
    if MPI.COMM_WORLD.Get_size() == 2:  # wire_reduce's references are for 2 ranks
        runs.append(("wire_reduce.py", ["--backend", "tf"]))
    if sys.argv[1:]:
        runs.append(("train_runs.py", sys.argv[1:]))
    for script, args in runs:
        path = os.path.join(HERE, script)
        sys.argv = [path, *args]
        runpy.run_path(path, run_name="__main__")  # each later one shares the first's TensorFlow cluster


if __name__ == "__main__":
    main()
