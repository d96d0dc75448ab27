#!/usr/bin/env python3
"""Experiment tracking for `branchgrpo train` as a sidecar: metrics, leaf grids and held-out evaluations to
TensorBoard (and wandb).

    python3 scripts/track.py RUN_DIR --tensorboard LOGDIR [--wandb-offline WANDB_DIR [--project P] [--name N]]
                             [--follow [--poll SECONDS] | --once]

RUN_DIR is a run's `run.output_dir` (docs/cli.md, "branchgrpo train"). What is read there:

  metrics.jsonl           one JSON object per iteration, appended by train (one write + fsync per line). Its
                          "iteration" key (0-based) is the step; every other key with a number value (reward_mean,
                          reward_std, reward_min, reward_max, reward/<name>, evaluations, update_evaluations,
                          edges, edges_trained, trees_dropped, loss, clip_fraction, grad_norm, seconds,
                          rollout_seconds, reward_seconds, update_seconds, and any key a later version adds) is
                          logged as a scalar under its own name (a NaN is written by train as null: skipped).
                          With [eval], also one row per held-out evaluation, {"kind": "eval", "iteration": k, ...}
                          with k the iterations done before it (it sits before iteration k's own row; the last, k =
                          run.iterations, after the last iteration's): every number key of it is logged as
                          eval/<key> at step k (eval/reward_mean, eval/reward_low, eval/reward/<name>/high,
                          eval/prompts, eval/seconds, ...; "ema", a boolean, and nulls are not). The evaluation
                          after k iterations and iteration k share the step and nothing else: each has its own
                          tags and its own record of what was written.
  grids/iter-NNNNNN.png   the leaf images written after N iterations completed, i.e. those of iteration N - 1 of
                          metrics.jsonl; logged as the image "grids/leaves" at step N - 1, next to that iteration's
                          scalars. A grid is taken once its iteration's line is in metrics.jsonl and the grid is
                          no older than what followed it (a later line, or the file's last write): after a resume,
                          the previous start's grid of an iteration is not taken in place of the new one.
  grids/iter-NNNNNN.gif   (train writes none today: a video run's grid is a PNG of frame strips) its FIRST FRAME is
                          logged as above; a .png of the same N wins.
  eval/iter-NNNNNN.png    the grid of the evaluation after N iterations: the image "eval/grid" at step N, taken by
                          the rule of the leaf grids once the evaluation's row is in metrics.jsonl. A video run's
                          eval/iter-NNNNNN.gif: its first frame, when there is no .png of the same N.
  config.toml             run.iterations (default 100), run.grid_every (default 10) and eval.embeddings (non-empty:
                          [eval] is on): --follow ends after the final iteration's line (iteration =
                          run.iterations - 1) and its final grid and, with [eval], the final evaluation's row (k =
                          run.iterations) and its grid (waits up to 30 s for the grids). Re-read when it changes (a
                          resume may raise run.iterations).

Resume and restarts: `train --resume` from checkpoint iter-K cuts metrics.jsonl after the last line of an
iteration (or evaluation) before K and appends from there (the kept lines are never rewritten; the evaluation after
K iterations is cut and written again). Each poll reads only what was appended; when the file shrank, was
replaced, or the last line read is no longer where it was, it is read again from the start. Either way an
iteration, and an evaluation, is logged at most once: the steps written (iterations' scalars, leaf grids,
evaluations' scalars, evaluation grids, each apart) are kept in LOGDIR/track_state.json (a state written before
the evaluations were tracked reads as none of them written), so a second track.py on the same LOGDIR (after a
restart, or with --once again) writes only what is new, and the values of an iteration or evaluation that train
wrote again after a resume are the first ones seen (bit-identical on CPU).
Each batch is recorded as pending in the state before it is written and as done after the writer's flush; a
track.py killed in between (SIGKILL) finds on its next start which of the pending steps reached its event file
(read with tensorboard's own event-file loader) and writes only the others. A lock file
(LOGDIR/track_state.lock) keeps a second track.py off a LOGDIR in use.

Lines: a partial last line (train is writing it) is left for the next poll. A complete line that is not a JSON
object with an integer "iteration" in [0, 2^31), or has a "kind" other than "eval", is reported on stderr in one
line, `track.py: RUN/metrics.jsonl:7: malformed line skipped: ...`, once per process, and skipped.

--follow polls every --poll seconds (default 2) until the end (config.toml above), or SIGINT / SIGTERM: the batch being
written is finished and flushed, the state saved, exit 0. --once (the default) logs what is there and exits.

TensorBoard writer: tensorboardX 2.6.2.2. It writes TensorBoard's event format with numpy, protobuf and Pillow
alone (it imports PyTorch when installed, only to accept tensors: kept out here); torch.utils.tensorboard would
make this sidecar depend on PyTorch (Debian's 1.13 here: about 0.7 s more start-up and its memory, and a large
package on a machine that only watches a run), for the same SummaryWriter design and the same event files.
The `tensorboard` package (2.15.2; the viewer, and the reader this script's recovery and its test use) is needed
anyway. Tested here with /usr/bin/python3 3.11, numpy 1.24.2 (Debian), Pillow 9.4.0 (Debian), tensorboardX
2.6.2.2, tensorboard 2.15.2 (viewer included), protobuf 6.33.6: scripts/setup.sh installs them. protobuf is
pinned too, for a reproducible install: 6.33.6 is accepted by tensorboard 2.15 (>= 3.19.6, not 4.24.0),
tensorboardX 2.6.2.2 (>= 3.20) and wandb 0.31 (>= 5, < 8, not 5.28.0 / 5.29.0) alike (7.36 worked here as well).

wandb (optional, not in setup.sh): --wandb-offline WANDB_DIR logs the same scalars and grids under the same names
(x-axis: the metric "iteration", defined as every key's step metric; an evaluation's rows carry its k) to an
offline run (WANDB_MODE=offline: nothing is sent; upload later with `wandb sync`). Its run id is kept in the
state, so a restarted track.py continues the same run (a new offline-run-* directory with the same id). Install:
python3 -m pip install 'wandb==0.31.0' (tested here; Debian's /usr/bin/python3 needs --break-system-packages, as
the error line without it says).

Exit status: 0 done (or stopped by a signal); 1 a file that cannot be read or written, or a missing package;
2 bad arguments.
"""
import argparse
import errno
import fcntl
import json
import math
import os
import re
import secrets
import signal
import stat
import sys
import time

try:
    import tomllib
except ImportError:  # Python < 3.11: the final iteration is unknown, --follow runs until a signal
    tomllib = None

PROG = "track.py"
TENSORBOARD_PIP = "'tensorboard==2.15.2' 'tensorboardX==2.6.2.2' 'protobuf==6.33.6'"
WANDB_PIP = "'wandb==0.31.0'"
STATE_NAME = "track_state.json"
STATE_FORMAT = "branchgrpo-track-1"
GRID_TAG = "grids/leaves"
EVAL_PREFIX = "eval/"     # an evaluation row's keys are logged as eval/<key>, apart from the iterations' own
EVAL_GRID_TAG = EVAL_PREFIX + "grid"
GRID_NAME = re.compile(r"^iter-(\d{6,})\.(png|gif)$")
# What is logged, each a set of steps in the state: an iteration's scalars and leaf grid (step = the iteration),
# an evaluation's scalars and grid (step = the iterations done before it: the evaluation after k iterations and
# the training row of iteration k share step k, and each has its own set).
STREAMS = ("scalars", "images", "eval_scalars", "eval_images")
IMAGE_TAGS = {"images": GRID_TAG, "eval_images": EVAL_GRID_TAG}
# Per image stream: the folder of its grids in RUN_DIR, the stream of the rows they go with, and N - step for a grid
# iter-N: grids/iter-N shows iteration N - 1 (N counts the iterations completed), eval/iter-N the evaluation after
# N iterations.
GRID_SOURCES = {"images": ("grids", "scalars", 1), "eval_images": ("eval", "eval_scalars", 0)}
BATCH = 256              # rows (or grids) per flush and state update
FINAL_GRID_WAIT = 30.0   # seconds --follow waits for the final grid after the final line
DEFAULT_ITERATIONS, DEFAULT_GRID_EVERY = 100, 10  # docs/config.md, [run]


class Failure(Exception):
    """One line for stderr, and the exit status."""

    def __init__(self, message, status=1):
        super().__init__(message)
        self.status = status


def say(message):
    print("%s: %s" % (PROG, message), file=sys.stderr, flush=True)


def pip_line(packages):
    return "%s -m pip install %s%s" % (
        sys.executable, "--break-system-packages " if sys.executable.startswith("/usr/bin/") else "", packages)


# Sets of iterations as sorted [first, last] ranges (the state stays small for long runs).
def to_ranges(numbers):
    out = []
    for n in sorted(numbers):
        if out and n == out[-1][1] + 1:
            out[-1][1] = n
        elif not out or n > out[-1][1]:
            out.append([n, n])
    return out


def from_ranges(ranges, what):
    out = set()
    try:
        for first, last in ranges:
            if not (isinstance(first, int) and isinstance(last, int) and 0 <= first <= last):
                raise ValueError
            out.update(range(first, last + 1))
    except (TypeError, ValueError):
        raise Failure("%s: the state's %r is not a list of [first, last] iterations; move the file away to start "
                      "afresh (what LOGDIR holds would then be written again)" % (what, "ranges"))
    return out


def count(n, noun):
    return "%d %s%s" % (n, noun, "" if n == 1 else "s")


def range_text(numbers):
    return ", ".join(str(a) if a == b else "%d..%d" % (a, b) for a, b in to_ranges(numbers)) or "none"


class State:
    """LOGDIR/track_state.json: the run it belongs to, the steps written per stream, the wandb run id, a pending
    batch. A state from before the evaluations (no "eval_*" keys) reads as none written."""

    def __init__(self, logdir, run_dir):
        self.path = os.path.join(logdir, STATE_NAME)
        self.run_dir = run_dir
        self.written = {stream: set() for stream in STREAMS}
        self.wandb_id = None
        self.pending = None  # {"events": file name in LOGDIR, and per stream its steps as ranges}
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            raise Failure("%s: cannot read the state (%s); move it away to start afresh" % (self.path, e))
        if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
            raise Failure("%s: not a %s state file" % (self.path, STATE_FORMAT))
        if data.get("run_dir") != run_dir:
            raise Failure("%s: this LOGDIR tracks %s, not %s: give each run its own --tensorboard directory"
                          % (self.path, data.get("run_dir"), run_dir), 2)
        for stream in STREAMS:
            self.written[stream] = from_ranges(data.get(stream, []), self.path)
        self.wandb_id = data.get("wandb_id")
        self.pending = data.get("pending")
        if self.pending is not None and not isinstance(self.pending, dict):
            raise Failure("%s: the state's \"pending\" is not an object" % self.path)

    def save(self):
        data = {"format": STATE_FORMAT, "run_dir": self.run_dir, "wandb_id": self.wandb_id, "pending": self.pending}
        data.update((stream, to_ranges(steps)) for stream, steps in self.written.items())
        temporary = self.path + ".tmp"
        try:
            with open(temporary, "w", encoding="utf-8") as f:
                json.dump(data, f)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, self.path)
        except OSError as e:
            raise Failure("%s: cannot write the state: %s" % (self.path, e.strerror or e))


class MetricsReader:
    """metrics.jsonl read incrementally: whole lines only, read again from the start when it was cut or replaced."""

    def __init__(self, path):
        self.path = path
        self.reported = set()  # (line number, line) of malformed lines reported by this process
        self._reset()

    def _reset(self):
        self.offset = 0        # bytes of whole lines consumed
        self.tail = b""        # the last whole line consumed (its last 4096 bytes), to notice a rewrite
        self.inode = None
        self.lineno = 0
        self.lines = []        # (stream, iteration) of the valid lines of the current file, in file order
        self.position = {}     # (stream, iteration) -> its index in self.lines (the first such line)

    def _changed(self, info):
        if info.st_ino != self.inode or info.st_size < self.offset:
            return True
        if not self.tail:
            return False
        with open(self.path, "rb") as f:
            f.seek(self.offset - len(self.tail))
            return f.read(len(self.tail)) != self.tail

    def poll(self):
        """The new valid lines [(stream, iteration, {key: number})], stream "scalars" for an iteration's line and
        "eval_scalars" for an evaluation's (its keys prefixed with eval/); None when there is no file yet."""
        try:
            info = os.stat(self.path)
            if not stat.S_ISREG(info.st_mode):
                raise Failure("%s: not a regular file" % self.path)
            if self._changed(info):
                self._reset()
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(max(0, info.st_size - self.offset))
        except FileNotFoundError:
            self._reset()
            return None
        except OSError as e:
            raise Failure("%s: cannot read: %s" % (self.path, e.strerror or e))
        self.inode = info.st_ino
        self.mtime_ns = info.st_mtime_ns
        end = data.rfind(b"\n")
        if end < 0:
            return []  # nothing, or a partial line being written: left for the next poll
        rows = []
        for line in data[:end].split(b"\n"):
            self.lineno += 1
            row = self._parse(line)
            if row is not None:
                self.position.setdefault(row[:2], len(self.lines))
                self.lines.append(row[:2])
                rows.append(row)
        whole = data[:end + 1]
        self.offset += len(whole)
        self.tail = (whole[:-1][whole[:-1].rfind(b"\n") + 1:] + b"\n")[-4096:]
        return rows

    def _parse(self, line):
        reason = None
        try:
            obj = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            reason = "not UTF-8"
        except ValueError as e:
            reason = "not JSON (%s)" % getattr(e, "msg", e)
        except RecursionError:
            reason = "not JSON (nested too deeply)"
        else:
            iteration = obj.get("iteration") if isinstance(obj, dict) else None
            if not isinstance(obj, dict):
                reason = "not a JSON object"
            elif type(iteration) is not int or not 0 <= iteration < 2**31:
                reason = "no integer \"iteration\" in [0, 2^31)"
            elif "kind" in obj and obj["kind"] != "eval":  # a kind of row this script does not know: not guessed at
                reason = "unknown \"kind\" %s" % json.dumps(obj["kind"])[:40]
        if reason is not None:
            key = (self.lineno, line)
            if key not in self.reported:
                self.reported.add(key)
                say("%s:%d: malformed line skipped: %s" % (self.path, self.lineno, reason))
            return None
        evaluation = "kind" in obj
        values = {}
        for k, v in obj.items():
            if k != "iteration" and isinstance(v, (int, float)) and not isinstance(v, bool):
                try:
                    values[EVAL_PREFIX + k if evaluation else k] = float(v)
                except OverflowError:  # an integer past a double's range: no point
                    pass
        return ("eval_scalars" if evaluation else "scalars"), iteration, values

    def followed(self, stream, iteration):
        """Whether a valid line (of either kind) comes after the first line of (stream, iteration)."""
        return self.position[stream, iteration] + 1 < len(self.lines)


def read_image(path):
    """An image file as uint8 [H, W, 3] (a GIF: its first frame)."""
    import numpy as np
    from PIL import Image
    with Image.open(path) as image:
        image.seek(0)
        return np.asarray(image.convert("RGB"), dtype=np.uint8)


class TensorBoardSink:
    """tensorboardX's SummaryWriter on LOGDIR, opened at the first write (a pass with nothing new adds no file)."""

    def __init__(self, logdir):
        # tensorboardX imports PyTorch when it can, only to accept its tensors; this script passes numpy arrays,
        # so torch is kept out (a module set to None fails to import): ~0.7 s of start-up and its memory saved.
        if "torch" not in sys.modules:
            sys.modules["torch"] = None
        try:
            from tensorboardX import SummaryWriter
        except ImportError as e:
            raise Failure("--tensorboard needs tensorboardX (%s): %s" % (e, pip_line(TENSORBOARD_PIP)))
        self._writer_type = SummaryWriter
        self.logdir = logdir
        self.suffix = ".track-%d-%s" % (os.getpid(), secrets.token_hex(4))
        self.writer = None
        self.events = None

    def open(self):
        if self.writer is None:
            self.writer = self._writer_type(logdir=self.logdir, filename_suffix=self.suffix, flush_secs=3600)
            names = [n for n in os.listdir(self.logdir) if n.endswith(self.suffix)]
            self.events = names[0] if len(names) == 1 else None
        return self.events

    def scalars(self, iteration, values):
        for key, value in values.items():
            self.writer.add_scalar(key, value, global_step=iteration)

    def image(self, stream, step, pixels):
        self.writer.add_image(IMAGE_TAGS[stream], pixels, global_step=step, dataformats="HWC")

    def flush(self):
        if self.writer is not None:
            self.writer.flush()

    def close(self):
        if self.writer is not None:
            self.writer.close()


class WandbSink:
    """An offline wandb run (WANDB_MODE=offline) in WANDB_DIR, started at the first write."""

    def __init__(self, directory, project, name, state):
        os.environ["WANDB_MODE"] = "offline"
        os.environ.setdefault("WANDB_SILENT", "true")
        try:
            import wandb
        except ImportError as e:
            raise Failure("--wandb-offline needs wandb (%s): %s" % (e, pip_line(WANDB_PIP)))
        self.wandb = wandb
        self.directory, self.project, self.name, self.state = directory, project, name, state
        self.run = None

    def open(self):
        if self.run is not None:
            return
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as e:
            raise Failure("%s: cannot create: %s" % (self.directory, e.strerror or e))
        if not self.state.wandb_id:
            self.state.wandb_id = secrets.token_hex(4)
            self.state.save()
        handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.run = self.wandb.init(project=self.project, name=self.name, dir=self.directory, mode="offline",
                                       id=self.state.wandb_id, resume="allow",
                                       settings=self.wandb.Settings(console="off"))
            self.run.define_metric("iteration")
            self.run.define_metric("*", step_metric="iteration")
        except Exception as e:  # wandb's errors have no common base
            raise Failure("%s: wandb could not start an offline run: %s" % (self.directory, e))
        finally:
            for number, handler in handlers.items():  # this script's clean stop, not wandb's
                signal.signal(number, handler)

    def scalars(self, iteration, values):
        self.run.log(dict(values, iteration=iteration))

    def image(self, stream, step, pixels):
        caption = ("evaluation after %d iterations" if stream == "eval_images" else "iteration %d") % step
        self.run.log({"iteration": step, IMAGE_TAGS[stream]: self.wandb.Image(pixels, caption=caption)})

    def flush(self):
        pass  # the offline run's file is written by wandb's service; finish() ends it

    def close(self):
        if self.run is not None:
            self.run.finish()


def stream_of_tag(tag):
    """Which stream a tag of this script's event files belongs to."""
    if tag in (GRID_TAG, EVAL_GRID_TAG):
        return "images" if tag == GRID_TAG else "eval_images"
    return "eval_scalars" if tag.startswith(EVAL_PREFIX) else "scalars"


def recover_pending(state, logdir):
    """A batch recorded as pending (track.py killed while writing it): its steps found in its event file count as
    written (never written twice; a step cut short loses its missing tags), the others are written again."""
    pending = {stream: from_ranges(state.pending.get(stream, []), state.path) for stream in STREAMS}
    found = {stream: set() for stream in STREAMS}
    events = state.pending.get("events")
    try:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
        if events and os.path.exists(os.path.join(logdir, events)):
            for event in EventFileLoader(os.path.join(logdir, events)).Load():
                for value in event.summary.value:
                    found[stream_of_tag(value.tag)].add(event.step)
    except ImportError:
        say("%s: the last batch was interrupted and tensorboard (to read it back) is not installed: its "
            "steps count as written (%s)" % (state.path, pip_line(TENSORBOARD_PIP)))
        found = pending
    except Exception as e:  # a torn record at the end of the file: what was read before it counts
        say("%s: %s" % (os.path.join(logdir, events), e))
    kept = {stream: pending[stream] & found[stream] for stream in STREAMS}
    for stream in STREAMS:
        state.written[stream] |= kept[stream]
    state.pending = None
    state.save()

    def found_and_again(streams):
        return (range_text(set().union(*(kept[s] for s in streams))),
                range_text(set().union(*(pending[s] - kept[s] for s in streams))))
    iterations_found, iterations_again = found_and_again(("scalars", "images"))
    message = "recovered an interrupted batch: iterations %s found in %s, %s to be written again" % (
        iterations_found, events, iterations_again)
    if pending["eval_scalars"] or pending["eval_images"]:
        message += "; evaluations %s found, %s to be written again" % found_and_again(("eval_scalars", "eval_images"))
    say(message)


def run_settings(path, cached):
    """(run.iterations, run.grid_every, whether [eval] is on) from config.toml, re-read when it changed;
    (None, None, None) when unknown."""
    unknown = (None, None, None)
    try:
        mtime = os.stat(path).st_mtime_ns
    except OSError:
        return None, unknown
    if cached and cached[0] == mtime:
        return cached, cached[1]
    settings = unknown
    if tomllib is not None:
        try:
            with open(path, "rb") as f:
                config = tomllib.load(f)
            run, evaluation = config.get("run", {}), config.get("eval", {})
            iterations = run.get("iterations", DEFAULT_ITERATIONS)
            grid_every = run.get("grid_every", DEFAULT_GRID_EVERY)
            embeddings = evaluation.get("embeddings", "")  # docs/config.md, [eval]: "" = no evaluation
            if type(iterations) is int and type(grid_every) is int and isinstance(embeddings, str):
                settings = (iterations, grid_every, embeddings != "")
        except (OSError, ValueError, AttributeError):
            pass
    return (mtime, settings), settings


class Tracker:
    def __init__(self, args):
        self.run_dir = args.run_dir  # as given, in messages; the state names the run by its real path
        if not os.path.isdir(self.run_dir):
            raise Failure("%s: not a directory (RUN_DIR is a run's run.output_dir)" % args.run_dir, 2)
        self.logdir = args.tensorboard
        try:
            os.makedirs(self.logdir, exist_ok=True)
            self.lock = open(os.path.join(self.logdir, "track_state.lock"), "w")
        except OSError as e:
            raise Failure("%s: cannot create or write in it: %s" % (args.tensorboard, e.strerror or e))
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise Failure("%s: another track.py is writing there (%s is locked)"
                              % (args.tensorboard, self.lock.name))
            raise
        self.metrics_path = os.path.join(self.run_dir, "metrics.jsonl")
        self.state = State(self.logdir, os.path.realpath(self.run_dir))
        self.sinks = [TensorBoardSink(self.logdir)]
        if args.wandb_offline:
            self.sinks.append(WandbSink(os.path.abspath(args.wandb_offline), args.project,
                                        args.name or os.path.basename(os.path.realpath(self.run_dir)), self.state))
        if self.state.pending:
            recover_pending(self.state, self.logdir)
        self.reader = MetricsReader(self.metrics_path)
        self.values = {}        # (stream, step) -> scalars, read but not yet written, in file order
        self.bad_images = {}    # path -> (size, mtime) of an image that could not be read (reported once)
        self.settings_cache = None
        self.final_seen_at = None
        self.new = {stream: set() for stream in STREAMS}

    def grids(self, stream):
        """The grids of an image stream that may be logged now: [(step, path, stat)], a PNG before a GIF of the
        same N."""
        folder, row_stream, offset = GRID_SOURCES[stream]
        found = {}
        try:
            entries = list(os.scandir(os.path.join(self.run_dir, folder)))
        except OSError:
            return []
        for entry in entries:
            match = GRID_NAME.match(entry.name)
            if not match or int(match.group(1)) < offset:
                continue
            step = int(match.group(1)) - offset
            if step in found and found[step].name.endswith(".png"):
                continue
            found[step] = entry
        out = []
        for step, entry in sorted(found.items()):
            if step in self.state.written[stream] or (row_stream, step) not in self.reader.position:
                continue
            try:
                info = entry.stat()
            except OSError:
                continue
            # A grid is written after its row (and before the next row of either kind): it is this start's when a
            # line follows, or when it is no older than the file's last write (a resumed run's old grids are older
            # than the cut).
            if not (self.reader.followed(row_stream, step) or info.st_mtime_ns >= self.reader.mtime_ns):
                continue
            if self.bad_images.get(entry.path) == (info.st_size, info.st_mtime_ns):
                continue
            out.append((step, entry.path, info))
        return out

    def write(self, items):
        """One batch of (stream, step, scalars or pixels): recorded as pending, written to every sink, flushed,
        recorded as done."""
        events = self.sinks[0].open()
        for sink in self.sinks[1:]:
            sink.open()
        steps = {stream: {step for s, step, _ in items if s == stream} for stream in STREAMS}
        self.state.pending = {"events": events}
        self.state.pending.update((stream, to_ranges(steps[stream])) for stream in STREAMS)
        self.state.save()
        for stream, step, payload in items:
            for sink in self.sinks:
                if stream in IMAGE_TAGS:
                    sink.image(stream, step, payload)
                else:
                    sink.scalars(step, payload)
        for sink in self.sinks:
            sink.flush()
        for stream in STREAMS:
            self.state.written[stream] |= steps[stream]
            self.new[stream] |= steps[stream]
        self.state.pending = None
        self.state.save()

    def write_in_batches(self, items):
        for start in range(0, len(items), BATCH):
            self.write(items[start:start + BATCH])

    def poll(self):
        """Logs what is new. Returns True when the run's final iteration and its final grid are logged (with [eval],
        the final evaluation and its grid too)."""
        rows = self.reader.poll()
        for stream, step, values in rows or []:
            if step not in self.state.written[stream] and (stream, step) not in self.values:
                self.values[stream, step] = values
        self.write_in_batches([(stream, step, values) for (stream, step), values in self.values.items()])
        self.values.clear()
        if rows is not None:
            images = []
            for stream in GRID_SOURCES:
                for step, path, info in self.grids(stream):
                    try:
                        images.append((stream, step, read_image(path)))
                    except ImportError as e:
                        raise Failure("reading %s needs numpy and Pillow (%s)" % (path, e))
                    except Exception as e:  # Pillow's errors have no common base
                        self.bad_images[path] = (info.st_size, info.st_mtime_ns)
                        say("%s: cannot read the image, skipped: %s" % (path, e))
                    if len(images) == BATCH:
                        self.write(images)
                        images = []
            self.write_in_batches(images)
        self.settings_cache, (iterations, grid_every, evaluates) = run_settings(
            os.path.join(self.run_dir, "config.toml"), self.settings_cache)
        if iterations is None:
            return False
        # The end: the last iteration's row and grid and, with [eval], the evaluation after the last iteration
        # (step = run.iterations, its row after the last iteration's) and its grid.
        final_rows = [("scalars", iterations - 1)] + ([("eval_scalars", iterations)] if evaluates else [])
        final_grids = (([("images", iterations - 1)] if grid_every != 0 else [])
                       + ([("eval_images", iterations)] if evaluates else []))
        written = self.state.written
        if any(step not in written[stream] for stream, step in final_rows):
            return False
        missing = [(stream, step) for stream, step in final_grids if step not in written[stream]]
        if not missing:
            return True
        if self.final_seen_at is None:
            self.final_seen_at = time.monotonic()
        if time.monotonic() - self.final_seen_at < FINAL_GRID_WAIT:
            return False
        for stream, step in missing:
            what = "the final evaluation (after %d iterations)" if stream == "eval_images" else "the final iteration %d"
            say("%s: no grid of %s after %g s; stopping"
                % (os.path.join(self.run_dir, GRID_SOURCES[stream][0]), what % step, FINAL_GRID_WAIT))
        return True

    def close(self):
        for sink in self.sinks:
            sink.close()

    def summary(self):
        new, written = self.new, self.state.written
        text = "%s: %s (%s), %s" % (self.logdir, count(len(new["scalars"]), "new iteration"),
                                    range_text(new["scalars"]), count(len(new["images"]), "new grid"))
        evaluations = written["eval_scalars"] or written["eval_images"]  # a run without [eval]: not mentioned
        if evaluations:
            text += ", %s (%s), %s" % (count(len(new["eval_scalars"]), "new evaluation"),
                                       range_text(new["eval_scalars"]), count(len(new["eval_images"]),
                                                                               "new evaluation grid"))
        text += "; %s and %s" % (count(len(written["scalars"]), "iteration"), count(len(written["images"]), "grid"))
        if evaluations:
            text += ", %s and %s" % (count(len(written["eval_scalars"]), "evaluation"),
                                     count(len(written["eval_images"]), "evaluation grid"))
        return text + " logged in all"


def parse_arguments(argv):
    parser = argparse.ArgumentParser(
        prog=PROG, description="Log a branchgrpo train run's metrics.jsonl and grids to TensorBoard (and wandb, "
                               "offline). Details: the module docstring and docs/cli.md, 'Experiment tracking'.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run's run.output_dir")
    parser.add_argument("--tensorboard", metavar="LOGDIR", required=True,
                        help="TensorBoard log directory (one per run; holds track_state.json)")
    parser.add_argument("--wandb-offline", metavar="WANDB_DIR", help="also log to an offline wandb run here")
    parser.add_argument("--project", help="wandb project (default: branchgrpo)")
    parser.add_argument("--name", help="wandb run name (default: RUN_DIR's name)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--follow", action="store_true", help="keep polling until the final iteration or a signal")
    mode.add_argument("--once", action="store_true", help="log what is there and exit (the default)")
    parser.add_argument("--poll", metavar="SECONDS", type=float, default=2.0,
                        help="seconds between polls with --follow (default 2)")
    args = parser.parse_args(argv)
    if not (math.isfinite(args.poll) and 0.01 <= args.poll <= 3600):
        parser.error("--poll %g: must be in [0.01, 3600] seconds" % args.poll)
    if (args.project or args.name) and not args.wandb_offline:
        parser.error("--project and --name are wandb's: pass --wandb-offline WANDB_DIR too")
    args.project = args.project or "branchgrpo"
    return args


def main(argv):
    args = parse_arguments(argv)
    stop = []

    def on_signal(number, frame):
        stop.append(signal.Signals(number).name)

    tracker = None
    try:
        tracker = Tracker(args)
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        waiting_said = False
        while True:
            done = tracker.poll()
            if tracker.reader.inode is None:
                if not args.follow:
                    raise Failure("%s: not found (has the run started?)" % tracker.metrics_path)
                if not waiting_said:
                    say("waiting for %s" % tracker.metrics_path)
                    waiting_said = True
            if done or not args.follow or stop:
                break
            deadline = time.monotonic() + args.poll
            while not stop and time.monotonic() < deadline:
                time.sleep(min(0.05, args.poll))
            if stop:
                tracker.poll()  # what came before the signal, then stop
                break
        tracker.close()
        print("%s: %s%s" % (PROG, tracker.summary(), "; stopped by " + stop[0] if stop else ""), flush=True)
        return 0
    except Failure as failure:
        if tracker is not None:
            try:
                tracker.close()
            except Exception:
                pass
        say(str(failure))
        return failure.status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
