#!/usr/bin/env python3
"""Write the JobSet that runs `jaxlm train` on a GKE TPU node pool: one pod per TPU host of the slice
(or slices), all started together, the whole set restarted after a fault (the run resumes).

    python launch/gke_jobset.py --name bert-large --image IMAGE --tpu v5p --topology 4x4x4 \\
        --config configs/bert-large.yaml [--slices N] [--max-restarts N] [--env KEY=VALUE ...] \\
        [--mount BUCKET:PATH ...] [--service-account NAME] [-- section.key=value ...] [--apply]

Without --apply it prints the manifest (the dry run); with it, pipes it to `kubectl apply -f -`.
The image holds this checkout installed with `pip install -e .[tpu]` (launch/Dockerfile), so the config and
its overrides are checked here first, with this checkout's jaxlm. --mount puts a Cloud Storage bucket at PATH
in every pod (GKE's Cloud Storage FUSE driver, read by a Kubernetes service account with access to it):
the prepared data, which ArrayRecord reads as local files.
"""
from __future__ import annotations

import argparse
import itertools
import math
import pathlib
import re
import shutil
import subprocess
import sys

import yaml

import check_config as config_check  # launch/check_config.py, beside this file

# GKE's node label, the chips of one host and the sizes in a slice's topology, per TPU generation (multi-host slices)
ACCELERATORS = {"v4": ("tpu-v4-podslice", 4, 3), "v5p": ("tpu-v5p-slice", 4, 3),
                "v5e": ("tpu-v5-lite-podslice", 4, 2), "v6e": ("tpu-v6e-slice", 4, 2)}
TOPOLOGY = re.compile(r"[1-9][0-9]*(x[1-9][0-9]*)*")  # GKE's label, word for word: 4x4x4, not 4X4X4 or 04x4x4
ENV = {"JAX_PLATFORMS": "tpu"}  # the container's variables the JobSet sets itself
INT32 = 2**31 - 1  # Kubernetes' counts (replicas, parallelism, maxRestarts) are int32
GRACE_SECONDS = 300  # between SIGTERM and SIGKILL: the checkpoint at the agreed step is written in it
# what JobSet accepts as a name (an RFC 1035 DNS label; its services and pods are named after it)
NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
# a pod's name: JobSet's NAME-JOB-J-P (replicated job, job index, pod index) and five random characters, at most 63
POD_NAME = "{name}-slice-{job}-{pod}-xxxxx"
FLAGS = ("--apply", "-h", "--help")  # the options that take no value
ROOT = pathlib.Path(__file__).resolve().parents[1]  # the checkout the image is built from
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
BUCKET = re.compile(r"[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9]")  # Cloud Storage's bucket names


def chips(args) -> int:
    dims = ACCELERATORS[args.tpu][2]
    if not TOPOLOGY.fullmatch(args.topology) or args.topology.count("x") != dims - 1:
        raise ValueError(f"--topology {args.topology!r}: a {args.tpu} slice's topology is {dims} sizes joined by a "
                         f"lower-case x, like {'x'.join(['4'] * dims)}")
    return math.prod(int(size) for size in args.topology.split("x"))


def hosts(args) -> int:
    """The TPU hosts (pods) of one slice."""
    per_host = ACCELERATORS[args.tpu][1]
    total = chips(args)
    if total > per_host and total % per_host:
        raise ValueError(f"--topology {args.topology} has {total} chips, not a multiple of the {per_host} per host")
    if total // per_host > INT32:
        raise ValueError(f"--topology {args.topology} has {total // per_host} hosts, more pods than Kubernetes "
                         f"counts ({INT32})")
    return max(total // per_host, 1)


def check(args) -> None:
    """Every option, before anything is written: a ValueError that names the option and what to give."""
    pods = hosts(args)
    if not 1 <= args.slices <= INT32:
        raise ValueError(f"--slices {args.slices}: give 1 to {INT32} (Kubernetes' int32)")
    if not 0 <= args.max_restarts <= INT32:
        raise ValueError(f"--max-restarts {args.max_restarts}: give 0 to {INT32} (Kubernetes' int32)")
    pattern = POD_NAME.format(name="NAME", job=args.slices - 1, pod=pods - 1)
    limit = 63 - len(pattern) + len("NAME")
    if not NAME.fullmatch(args.name) or len(args.name) > limit:
        raise ValueError(f"--name {args.name!r}: Kubernetes takes lower-case letters, digits and '-', starting with a "
                         f"letter, ending with a letter or digit, at most {limit} of them here (pod names {pattern} "
                         "must fit in 63)")
    if args.apply and shutil.which("kubectl") is None:
        raise ValueError("--apply pipes the manifest to kubectl, which is not on PATH: install it (gcloud components "
                         "install kubectl), or leave --apply out and apply the printed manifest yourself")
    if not args.image.strip():
        raise ValueError("--image needs the image to run, e.g. REGISTRY/jaxlm:TAG (launch/Dockerfile)")
    if not args.config.strip():
        raise ValueError("--config needs the config's path in the image, e.g. configs/bert-large.yaml")
    bad = [pair for pair in args.env if "=" not in pair or pair.startswith("=")]
    if bad:
        raise ValueError(f"--env takes KEY=VALUE with a KEY, got {bad[0]!r}")
    keys = [pair.split("=", 1)[0] for pair in args.env]
    for key in keys:
        if not ENV_NAME.fullmatch(key):
            raise ValueError(f"--env {key}: a variable's name is letters, digits and '_', not starting with a digit")
        if key in ENV:
            raise ValueError(f"--env {key}: the JobSet sets {key}={ENV[key]} itself; leave it out")
        if keys.count(key) > 1:
            raise ValueError(f"--env {key} is given {keys.count(key)} times; give it once")
    for mount, (bucket, path) in zip(args.mount, mounts(args)):
        if not BUCKET.fullmatch(bucket) or not path.startswith("/") or path == "/":
            raise ValueError(f"--mount {mount!r}: give BUCKET:PATH, a Cloud Storage bucket's name and an absolute "
                             "directory in the pods, e.g. my-bucket:/mnt/data")
    paths = [path for _, path in mounts(args)]
    if len(set(paths)) < len(paths):
        raise ValueError("--mount puts two buckets at one path; give each its own")
    if args.mount and not args.service_account:
        raise ValueError("--mount needs --service-account NAME: the Kubernetes service account that may read the "
                         "bucket (GKE's Cloud Storage FUSE driver mounts it as that account)")
    check_config(args.config, args.overrides)


def mounts(args) -> list[tuple[str, str]]:
    """(bucket, path in the pods) of each --mount BUCKET:PATH."""
    return [(bucket, path) for bucket, _, path in (mount.partition(":") for mount in args.mount)]


def check_config(config: str, overrides: list[str]) -> None:
    """The config (a path in the image: the checkout's) and its overrides as `jaxlm train` will read them, where
    this checkout's jaxlm can be imported; a mistyped key was found only on the slice, and retried there."""
    path = ROOT / config
    if pathlib.PurePath(config).is_absolute() or not path.is_file():
        raise ValueError(f"--config {config}: no such file in this checkout ({ROOT}), which the image is built from; "
                         "give its path from the checkout's root")
    try:
        said = config_check.problem(path, overrides, shown=config)
    except ImportError:  # run by a python without jaxlm installed: the image checks it at the start
        print(config_check.unchecked_note("gke_jobset.py", config), file=sys.stderr)
        return
    if said is not None:
        raise ValueError(f"--config {said}")


def regroup(argv: list[str]) -> list[str]:
    """The command line with the options written after `--` moved before it, each with its value: `jaxlm train` takes
    no options, only section.key=value overrides, so `-- train.steps=10 --apply` means --apply."""
    if "--" not in argv:
        return argv
    at = argv.index("--")
    options, overrides = argv[:at], []
    words = iter(argv[at + 1:])
    for word in words:
        if not word.startswith("-"):
            overrides.append(word)
            continue
        options.append(word)
        if word not in FLAGS and "=" not in word:
            options.extend(itertools.islice(words, 1))
    return [*options, "--", *overrides]


def manifest(args) -> dict:
    """The JobSet as a dict."""
    accelerator, per_host, _ = ACCELERATORS[args.tpu]
    total = chips(args)
    pods = hosts(args)
    env = [{"name": key, "value": value} for key, value in (pair.split("=", 1) for pair in args.env)]
    container = {
        "name": "jaxlm", "image": args.image,
        "command": ["jaxlm", "train", args.config, *args.overrides],
        "env": env + [{"name": key, "value": value} for key, value in ENV.items()],
        "ports": [{"containerPort": 8471}, {"containerPort": 8080}],
        "resources": {"limits": {"google.com/tpu": min(total, per_host)}},
    }
    pod = {"restartPolicy": "Never", "terminationGracePeriodSeconds": GRACE_SECONDS,
           "nodeSelector": {"cloud.google.com/gke-tpu-accelerator": accelerator,
                            "cloud.google.com/gke-tpu-topology": args.topology},
           "containers": [container]}
    template = {"spec": pod}
    if args.service_account:  # also what writes a gs:// run directory (Workload Identity)
        pod["serviceAccountName"] = args.service_account
    if args.mount:
        template["metadata"] = {"annotations": {"gke-gcsfuse/volumes": "true"}}
        pod["volumes"] = [{"name": f"bucket-{i}", "csi": {"driver": "gcsfuse.csi.storage.gke.io", "volumeAttributes": {
            "bucketName": bucket, "mountOptions": "implicit-dirs"}}} for i, (bucket, _) in enumerate(mounts(args))]
        container["volumeMounts"] = [{"name": f"bucket-{i}", "mountPath": path}
                                     for i, (_, path) in enumerate(mounts(args))]
    job = {"parallelism": pods, "completions": pods, "backoffLimit": 0, "template": template}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": args.name,
                         "annotations": {"alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"}},
            "spec": {"failurePolicy": {"maxRestarts": args.max_restarts},
                     "replicatedJobs": [{"name": "slice", "replicas": args.slices, "template": {"spec": job}}]}}


class OneLineErrors(argparse.ArgumentParser):
    """argparse whose errors are one line, naming --help in place of its usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` shows how to call it)\n")


def main(argv=None) -> int:
    parser = OneLineErrors(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--image", required=True)
    parser.add_argument("--tpu", required=True, choices=sorted(ACCELERATORS))
    parser.add_argument("--topology", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--slices", type=int, default=1)
    parser.add_argument("--max-restarts", type=int, default=10)
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--mount", action="append", default=[], metavar="BUCKET:PATH")
    parser.add_argument("--service-account", default="", metavar="NAME")
    parser.add_argument("--apply", action="store_true", help="kubectl apply it instead of printing it")
    parser.add_argument("overrides", nargs="*", help="section.key=value for jaxlm train (after --)")
    args = parser.parse_args(regroup(sys.argv[1:] if argv is None else list(argv)))
    try:
        check(args)
        text = yaml.safe_dump(manifest(args), sort_keys=False)
    except ValueError as err:
        print(f"gke_jobset.py: error: {err}", file=sys.stderr)
        return 2
    if not args.apply:
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except OSError as err:  # a full disk, a closed pipe
            sys.stdout = None  # nothing left to flush at exit
            print(f"gke_jobset.py: error: the manifest could not be written to standard output ({err.strerror})",
                  file=sys.stderr)
            return 1
        return 0
    return subprocess.run(["kubectl", "apply", "-f", "-"], input=text, text=True).returncode


if __name__ == "__main__":
    sys.exit(main())
