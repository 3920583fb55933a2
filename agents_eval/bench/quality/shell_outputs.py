"""Shell observations: listings (`ls -la`, `git status`, `find`) and logs (a Python traceback, a Java
exception, a deploy with progress bars), with the redundancy real output carries: aligned columns,
punctuation rules, back-to-back repeated lines, blank-line runs."""

from __future__ import annotations

import random

from agents_eval.bench.quality.tool_questions import (
    FILE_STEMS,
    MODULES,
    Observation,
    code,
    exception_name,
    stamp,
)


def _ls_line(rng: random.Random, mode: str, size: int, name: str) -> str:
    return f"{mode}  1 agent agent {size:>7} May {rng.randint(1, 28):2d} {rng.randint(0, 23):02d}:" \
           f"{rng.randint(0, 59):02d} {name}"


def ls_listing(rng: random.Random) -> Observation:
    folder = f"deploy/{rng.choice(MODULES)}"
    link = rng.choice(("current", "latest", "active", "stable"))
    version = f"v{rng.randint(1, 9)}.{rng.randint(10, 40)}.{rng.randint(100, 999)}"
    target = f"releases/{version}"
    lines = [f"total {rng.randint(40, 400)}", _ls_line(rng, "drwxr-xr-x", 4096, ".")]
    lines += [_ls_line(rng, "-rw-r--r--", rng.randint(80, 99999), f"{stem}.yaml")
              for stem in rng.sample(FILE_STEMS, 2)]
    lines.insert(rng.randint(2, len(lines)), _ls_line(rng, "lrwxrwxrwx", len(target), f"{link} -> {target}"))
    return Observation("listing", "shell", f"ls -la {folder}", {"command": f"ls -la {folder}"}, "\n".join(lines),
                       f"In the `ls -la {folder}` output, which release does the symbolic link `{link}` point to? "
                       "Answer with the version only.", version, "ls")


def git_status(rng: random.Random) -> Observation:
    module = rng.choice(MODULES)
    stems = rng.sample(FILE_STEMS, 5)
    deleted = f"{stems[0]}.py"
    changes = [f"\tmodified:   src/{module}/{stem}.py" for stem in stems[1:4]]
    changes.insert(rng.randint(0, 3), f"\tdeleted:    src/{module}/{deleted}")
    branch = f"fix/{module}-{rng.randint(100, 999)}"
    lines = [f"On branch {branch}",
             "Changes not staged for commit:",
             '  (use "git add/rm <file>..." to update what will be committed)',
             *changes, "", "",
             "Untracked files:", f"\tsrc/{module}/{stems[4]}_test.py", "",
             'no changes added to commit (use "git add" and/or "git commit -a")']
    return Observation("listing", "shell", "git status", {"command": "git status"}, "\n".join(lines),
                       "Which branch is checked out, according to `git status`? Answer with the branch name only.",
                       branch, "git")


def find_large(rng: random.Random) -> Observation:
    name = f"{rng.choice(('orders', 'events', 'ledger', 'audit'))}_{rng.randint(2015, 2024)}." \
           f"{rng.choice(('csv', 'parquet', 'sql', 'jsonl'))}"
    denied = [f"find: './{p}': Permission denied" for p in rng.sample(
        (".cache/pip", "var/lib/postgres", "var/log/nginx", ".git/lfs/tmp", "tmp/systemd-private"), 3)]
    lines = [*denied[:2], f"./data/fixtures/{name}", denied[2]]
    return Observation("listing", "shell", "find . -size +10M", {"command": "find . -size +10M 2>&1"},
                       "\n".join(lines), "Which file in ./data/fixtures did `find . -size +10M` report? "
                       "Answer with the file name only.", name, "find")


def python_traceback(rng: random.Random) -> Observation:
    module, other = rng.sample(MODULES, 2)
    error = str(rng.randint(1000, 9999))
    retry = f"WARNING [{module}] upstream {other} not ready, retrying ..."
    lines = [f"{stamp(rng, 14)} INFO  [{module}] processing batch {rng.randint(1000, 9999)}",
             *[retry] * rng.randint(2, 4), "=" * 48,
             "Traceback (most recent call last):",
             f'  File "/app/src/{module}/worker.py", line {rng.randint(20, 300)}, in run',
             "    self.process(batch)",
             f'  File "/app/src/{other}/client.py", line {rng.randint(20, 300)}, in post',
             "    raise UpstreamError(detail)",
             f"{other}.errors.UpstreamError: rejected with error code {error}",
             "=" * 48, "", "", ""]
    command = f"tail -n 40 logs/{module}.log"
    return Observation("log", "shell", command, {"command": command}, "\n".join(lines),
                       "What is the error code in the UpstreamError line? Answer with the code only.", error,
                       "traceback")


def java_exception(rng: random.Random) -> Observation:
    module = rng.choice(MODULES)
    exception, request = exception_name(rng), rng.randint(1000, 9999)
    package = f"com.shop.{module}"
    frames = [f"\tat {package}.api.{cls}.{method}({cls}.java:{rng.randint(20, 400)})"
              for cls, method in (("Handler", "apply"), ("Routes", "dispatch"))]
    lines = [f"{stamp(rng, 15)} ERROR 1 --- [nio-8080-exec-{rng.randint(1, 9)}] o.a.c.c.C.[dispatcherServlet]"
             "    : Servlet.service() threw exception",
             f"{package}.{exception}: request {request} failed",
             *frames, f"\t... {rng.randint(30, 90)} common frames omitted", "", "", ""]
    command = f"kubectl logs deploy/{module}-api"
    return Observation("log", "shell", command, {"command": command}, "\n".join(lines),
                       f"Which exception class from package {package} was thrown? Answer with the class name only.",
                       exception, "java")


def deploy_log(rng: random.Random) -> Observation:
    service = rng.choice(MODULES)
    error = code(rng, "DPL")
    done = rng.randint(8, 20)
    lines = ["Step 5/9 : RUN pip install -r requirements.txt",
             f"[{'#' * done}{'.' * (24 - done)}] {done * 4}%",
             f"[{'#' * 24}] 100%",
             f'Waiting for deployment "{service}" rollout to finish: 1 of 3 updated replicas are available...',
             *[f'Waiting for deployment "{service}" rollout to finish: 2 of 3 updated replicas are available...']
             * rng.randint(3, 5),
             "-" * 40,
             f"error: deployment \"{service}\" exceeded its progress deadline (error {error})",
             "-" * 40]
    return Observation("log", "shell", f"./scripts/deploy.sh {service}", {"command": f"./scripts/deploy.sh {service}"},
                       "\n".join(lines), f"Which error code did `./scripts/deploy.sh {service}` report? "
                       "Answer with the code only.", error, "deploy")


LISTINGS = (ls_listing, git_status, find_large)
LOGS = (python_traceback, java_exception, deploy_log)
