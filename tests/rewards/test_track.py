#!/usr/bin/env python3
"""Tests scripts/track.py (experiment tracking as a sidecar; docs/cli.md, "Experiment tracking").

Each test builds a fake `branchgrpo train` output directory in a temporary folder: config.toml ([run]
iterations, grid_every; [eval] every, embeddings), metrics.jsonl with the real keys (nlohmann's compact, sorted
dump; a NaN as null), grids/iter-NNNNNN.png (N = iterations completed: the leaves of iteration N - 1) written with
Pillow and, with [eval], the evaluation rows ({"kind": "eval", "iteration": k}, before iteration k's row and after
the last) and their grids eval/iter-NNNNNN.png (N = k). track.py runs as a subprocess; its event files are read
back with tensorboard's own EventAccumulator and every scalar is checked exactly (value as float32, step = the
line's "iteration", each step once; an evaluation's keys under eval/), and every image (step, size, pixels).
Resume is simulated as train does it (metrics.jsonl cut in place after the last line before the checkpoint's
iteration, then appended, the grids rewritten), while track.py follows the file and across restarts of track.py.
wandb: the offline run is checked when wandb is importable, else that test is skipped; its missing-package line
always is.

Usage: test_track.py (needs tensorboard, tensorboardX, Pillow, numpy: scripts/setup.sh installs them)
"""
import glob
import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

try:
    import numpy as np
    from PIL import Image
    from tensorboard.backend.event_processing import event_accumulator
    if importlib.util.find_spec("tensorboardX") is None:  # what track.py writes with (not imported here)
        raise ImportError("No module named 'tensorboardX'")
except ImportError as e:
    sys.exit("error: %s: this test needs tensorboard, tensorboardX, Pillow and numpy (scripts/setup.sh installs "
             "them for %s)" % (e, sys.executable))

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "track.py")
REWARDS = ("alignment", "smoothness")
KEYS = ("reward_mean", "reward_std", "reward_min", "reward_max", "evaluations", "update_evaluations", "edges",
        "edges_trained", "trees_dropped", "loss", "clip_fraction", "grad_norm", "seconds", "rollout_seconds",
        "reward_seconds", "update_seconds") + tuple("reward/" + name for name in REWARDS)
EVAL_KEYS = ("prompts", "samples", "steps", "seconds", "reward_mean", "reward_low", "reward_high", "reward_failed",
             "reward/alignment", "reward/alignment/low", "reward/alignment/high", "reward/alignment/failed")
TIMEOUT = 60


def row(iteration, shift=0.0):
    """The metrics line train writes for `iteration` (values made up; `shift` marks a resumed run's rewrite)."""
    j = {"iteration": iteration, "evaluations": 24, "update_evaluations": 48, "edges": 30,
         "edges_trained": 28 - iteration, "trees_dropped": 0, "loss": -0.0123 * (iteration + 1) + shift,
         "clip_fraction": 0.125, "grad_norm": 0.3 + iteration / 7, "seconds": 1.5 + iteration / 3,
         "rollout_seconds": 0.9, "reward_seconds": 0.1, "update_seconds": 0.5,
         "reward_mean": 0.1 + iteration / 10 + shift,
         "reward_std": 0.05, "reward_min": 0.01, "reward_max": 0.9}
    for n, name in enumerate(REWARDS):
        j["reward/" + name] = 0.2 * (n + 1) + iteration / 100 + shift
    return j


def eval_row(done, shift=0.0):
    """The metrics line of the held-out evaluation after `done` iterations ("ema", a boolean, is no scalar)."""
    j = {"kind": "eval", "iteration": done, "prompts": 4, "samples": 2, "steps": 3, "ema": True,
         "seconds": 0.4 + done / 100, "reward_mean": 0.61 + done / 10 + shift, "reward_low": 0.58 + done / 10,
         "reward_high": 0.64 + done / 10, "reward_failed": 0}
    for suffix in ("", "/low", "/high", "/failed"):
        j["reward/alignment" + suffix] = j["reward_" + (suffix[1:] or "mean")]
    return j


def line(j):
    return json.dumps(j, sort_keys=True, separators=(",", ":")) + "\n"


def f32(value):
    return float(np.float32(value))


class TrackTest(unittest.TestCase):
    def setUp(self):
        folder = tempfile.TemporaryDirectory(prefix="track-test-")
        self.addCleanup(folder.cleanup)
        self.root = folder.name
        self.run_dir = os.path.join(self.root, "run")
        self.logdir = os.path.join(self.root, "tb")
        self.grids = os.path.join(self.run_dir, "grids")
        os.makedirs(self.grids)
        self.metrics = os.path.join(self.run_dir, "metrics.jsonl")
        self.env = dict(os.environ)
        for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
            self.env[name] = os.path.join(self.root, name.lower())  # nothing in the user's home
        self.env["TMPDIR"] = os.path.join(self.root, "tmp")  # wandb's service socket: removed with the rest
        os.makedirs(self.env["TMPDIR"])
        self.processes = []

    def tearDown(self):
        for process in self.processes:  # every test stops what it started
            if process.poll() is None:
                process.kill()
            process.wait()
            for stream in (process.stdout, process.stderr):
                if stream:
                    stream.close()

    # --- the fake run --------------------------------------------------------------------------------------
    def config(self, iterations, grid_every, eval_every=None):
        with open(os.path.join(self.run_dir, "config.toml"), "w") as f:
            f.write("[model]\ndir = \"models/shapes-tiny\"\n\n[run]\niterations = %d\ngrid_every = %d\n"
                    "output_dir = \"%s\"\n" % (iterations, grid_every, self.run_dir))
            if eval_every is not None:
                f.write("\n[eval]\nembeddings = \"heldout.safetensors\"\nevery = %d\n" % eval_every)

    def append(self, text):
        with open(self.metrics, "a") as f:
            f.write(text)

    def cut_after(self, iteration):
        """train --resume from checkpoint iter-(iteration + 1): the lines of iterations <= iteration are kept."""
        with open(self.metrics, "rb") as f:
            lines = f.read().split(b"\n")
        kept = [l for l in lines[:-1] if json.loads(l)["iteration"] <= iteration]
        os.truncate(self.metrics, sum(len(l) + 1 for l in kept))

    def grid(self, completed, colour, size=(12, 8), gif_second=None, folder="grids"):
        """grids/iter-<completed>.png (or a 2-frame .gif when gif_second is a colour), written as train does: into
        a temporary name, then renamed. folder="eval": the grid of the evaluation after `completed` iterations."""
        os.makedirs(os.path.join(self.run_dir, folder), exist_ok=True)
        path = os.path.join(self.run_dir, folder, "iter-%06d.%s" % (completed, "gif" if gif_second else "png"))
        pixels = np.zeros((size[1], size[0], 3), dtype=np.uint8)
        pixels[:, :] = colour
        pixels[0, 0] = (255, 255, 255)
        temporary = path + ".tmp-1-0"
        if gif_second:
            frames = [Image.fromarray(pixels), Image.new("RGB", size, gif_second)]
            frames[0].save(temporary, format="GIF", save_all=True, append_images=frames[1:], duration=250, loop=0)
        else:
            Image.fromarray(pixels).save(temporary, format="PNG")
        os.replace(temporary, path)
        return pixels

    # --- track.py ------------------------------------------------------------------------------------------
    def track(self, *extra, status=0, env=None):
        result = subprocess.run([sys.executable, SCRIPT, self.run_dir, "--tensorboard", self.logdir, *extra],
                                capture_output=True, text=True, timeout=TIMEOUT, env=env or self.env)
        self.assertEqual(result.returncode, status, "stdout:\n%s\nstderr:\n%s" % (result.stdout, result.stderr))
        return result

    def follow(self, *extra):
        process = subprocess.Popen([sys.executable, SCRIPT, self.run_dir, "--tensorboard", self.logdir, "--follow",
                                    "--poll", "0.1", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=self.env)
        self.processes.append(process)
        return process

    def state(self):
        try:
            with open(os.path.join(self.logdir, "track_state.json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def wait_for(self, scalars, process, images=None, **streams):
        """Until the state holds these ranges (streams: eval_scalars=..., eval_images=...)."""
        wanted = dict(streams, scalars=scalars, **({} if images is None else {"images": images}))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            state = self.state()
            if state and all(state.get(stream) == ranges for stream, ranges in wanted.items()):
                return
            if process.poll() is not None:
                self.fail("track.py --follow ended early: %s" % (process.communicate(),))
            time.sleep(0.05)
        self.fail("track.py did not log %s (state: %s)" % (wanted, self.state()))

    def events(self, image_tag="grids/leaves"):
        """{tag: [(step, value)]} and the images of `image_tag`, [(step, width, height, pixels)], as TensorBoard
        reads LOGDIR."""
        accumulator = event_accumulator.EventAccumulator(
            self.logdir, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.IMAGES: 0})
        accumulator.Reload()
        tags = accumulator.Tags()
        scalars = {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in tags["scalars"]}
        images = []
        self.assertLessEqual(set(tags["images"]), {"grids/leaves", "eval/grid"})
        if image_tag in tags["images"]:
            for e in accumulator.Images(image_tag):
                pixels = np.asarray(Image.open(io.BytesIO(e.encoded_image_string)).convert("RGB"))
                images.append((e.step, e.width, e.height, pixels))
        return scalars, sorted(images, key=lambda image: image[0])

    def check_scalars(self, scalars, expected, prefix="", keys=KEYS):
        """expected: {iteration: row}; each tag has each step once, with the row's value. prefix="eval/",
        keys=EVAL_KEYS: the evaluations' tags, which are all the others."""
        self.assertEqual({tag for tag in scalars if tag.startswith("eval/") == bool(prefix)},
                         {prefix + key for key in keys})
        for key in keys:
            want = [(i, f32(j[key])) for i, j in sorted(expected.items()) if j.get(key) is not None]
            self.assertEqual(sorted(scalars[prefix + key]), want, key)

    def check_evaluations(self, scalars, expected):
        self.check_scalars(scalars, expected, prefix="eval/", keys=EVAL_KEYS)

    def event_files(self):
        return sorted(glob.glob(os.path.join(self.logdir, "events.out.tfevents.*")))

    # --- tests ---------------------------------------------------------------------------------------------
    def test_once_logs_every_numeric_key_and_the_grids(self):
        self.config(iterations=6, grid_every=2)
        rows = {i: row(i) for i in range(4)}
        rows[2]["loss"] = None  # train writes a NaN as null: not a point
        # Line 4 is being written (left for the next poll); the grids are no older than the file's last write.
        self.append("".join(line(j) for j in rows.values()) + '{"iteration":4,"reward_mean":0.')
        gif_first = self.grid(2, (200, 0, 0), gif_second=(0, 0, 200))   # iteration 1, a GIF: its first frame
        png = self.grid(4, (0, 150, 0), size=(20, 6))                    # iteration 3
        self.grid(6, (9, 9, 9))  # iteration 5: no line yet, not logged
        open(os.path.join(self.grids, "iter-000004.png.tmp-7-1"), "w").close()  # train's temporary: ignored
        result = self.track("--once")
        self.assertEqual(result.stderr, "")
        self.assertIn("4 new iterations (0..3), 2 new grids", result.stdout)
        scalars, images = self.events()
        self.check_scalars(scalars, rows)
        self.assertEqual([(step, w, h) for step, w, h, _ in images], [(1, 12, 8), (3, 20, 6)])
        np.testing.assert_array_equal(images[0][3], gif_first)
        np.testing.assert_array_equal(images[1][3], png)
        self.assertEqual(self.state()["scalars"], [[0, 3]])
        self.assertEqual(self.state()["images"], [[1, 1], [3, 3]])

        # Line 4 completed: a second track.py writes it alone; a third, with nothing new, adds no event file.
        self.append('5}\n')
        rows[4] = dict(row(4), reward_mean=0.5)
        for key in KEYS:  # the completed line holds what was written: iteration and reward_mean
            if key != "reward_mean":
                rows[4][key] = None
        self.assertIn("1 new iteration (4)", self.track().stdout)
        files = self.event_files()
        self.assertIn("0 new iterations (none)", self.track("--once").stdout)
        self.assertEqual(self.event_files(), files)
        scalars, images = self.events()
        self.check_scalars(scalars, rows)
        self.assertEqual(len(images), 2)

    def test_follow_through_a_resume_writes_each_iteration_once(self):
        self.config(iterations=10, grid_every=2)
        rows = {i: row(i) for i in range(5)}
        self.append("".join(line(rows[i]) for i in range(5)))
        self.grid(2, (10, 20, 30))
        self.grid(4, (40, 50, 60))
        old_grid_6 = self.grid(6, (1, 1, 1))  # a grid of iteration 5 from before the resume
        os.utime(os.path.join(self.grids, "iter-000006.png"), ns=(10**18, 10**18))
        process = self.follow()
        self.wait_for([[0, 4]], process, images=[[1, 1], [3, 3]])
        second = subprocess.run([sys.executable, SCRIPT, self.run_dir, "--tensorboard", self.logdir, "--once"],
                                capture_output=True, text=True, timeout=TIMEOUT, env=self.env)
        self.assertEqual(second.returncode, 1)
        self.assertRegex(second.stderr, r"^track\.py: .*another track\.py is writing there .*\n$")

        # train --resume from checkpoint iter-000003: the file shrinks to iterations 0..2, then grows past where
        # track.py had read, with other values for 3 and 4 (already logged: kept as first seen) and a new 5.
        self.cut_after(2)
        self.append(line(row(3, shift=100)) + line(row(4, shift=100)))
        self.grid(4, (99, 99, 99))  # iteration 3's grid again: already logged, not again
        self.append(line(row(5, shift=100)))
        rows[5] = row(5, shift=100)
        self.wait_for([[0, 5]], process)
        time.sleep(0.3)  # line 5 is the last: the old grid of iteration 5 is older than it, so not taken
        self.assertEqual(self.state()["images"], [[1, 1], [3, 3]])
        new_grid_6 = self.grid(6, (7, 77, 177))
        self.wait_for([[0, 5]], process, images=[[1, 1], [3, 3], [5, 5]])

        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=10)
        self.assertLess(time.monotonic() - started, 5)
        self.assertEqual(process.returncode, 0, stderr)
        self.assertIn("stopped by SIGTERM", stdout)
        self.assertEqual(stderr, "")

        self.assertIn("0 new iterations (none)", self.track("--once").stdout)  # a restart writes nothing again
        scalars, images = self.events()
        self.check_scalars(scalars, rows)
        self.assertEqual([image[0] for image in images], [1, 3, 5])
        np.testing.assert_array_equal(images[2][3], new_grid_6)
        self.assertFalse(np.array_equal(images[2][3], old_grid_6))

        # After a restart of track.py: the run resumed again from iter-000006, lines 6, 7 new.
        self.cut_after(5)
        rows.update({i: row(i, shift=200) for i in (6, 7)})
        self.append(line(rows[6]) + line(rows[7]))
        self.assertIn("2 new iterations (6..7), 0 new grids", self.track("--once").stdout)
        self.check_scalars(self.events()[0], rows)

    def test_follow_ends_after_the_final_line_and_grid(self):
        self.config(iterations=3, grid_every=3)
        self.append(line(row(0)) + line(row(1)))
        process = self.follow()
        self.wait_for([[0, 1]], process)
        self.append(line(row(2)))
        self.wait_for([[0, 2]], process)
        time.sleep(0.3)
        self.assertIsNone(process.poll(), "ended before the final grid")
        final = self.grid(3, (5, 6, 7))  # written after the final line, as train does
        stdout, stderr = process.communicate(timeout=20)
        self.assertEqual(process.returncode, 0, stderr)
        self.assertIn("3 new iterations (0..2), 1 new grid", stdout)
        scalars, images = self.events()
        self.check_scalars(scalars, {i: row(i) for i in range(3)})
        self.assertEqual([image[0] for image in images], [2])
        np.testing.assert_array_equal(images[0][3], final)

    def test_evaluations_are_logged_apart_from_the_iterations_of_the_same_step(self):
        self.config(iterations=4, grid_every=2, eval_every=2)
        # A state file from before the evaluations (no eval_* keys) is read as none of them written.
        os.makedirs(self.logdir)
        with open(os.path.join(self.logdir, "track_state.json"), "w") as f:
            json.dump({"format": "branchgrpo-track-1", "run_dir": os.path.realpath(self.run_dir), "scalars": [],
                       "images": [], "wandb_id": None, "pending": None}, f)
        rows = {i: row(i) for i in range(4)}
        evaluations = {k: eval_row(k) for k in (0, 2, 4)}
        evaluations[2]["reward/alignment/low"] = None  # fewer than 2 finite samples: no point
        self.append(line(evaluations[0]) + line(rows[0]) + line(rows[1]) + line(evaluations[2]) + line(rows[2])
                    + line(rows[3]) + line(evaluations[4]))
        leaves = [self.grid(2, (10, 20, 30)), self.grid(4, (40, 50, 60))]
        first = self.grid(0, (1, 2, 3), folder="eval")
        second = self.grid(2, (4, 5, 6), size=(6, 4), folder="eval")
        self.grid(2, (90, 90, 90), gif_second=(0, 0, 0), folder="eval")  # a video run's GIF: the PNG wins
        final = self.grid(4, (7, 8, 9), gif_second=(0, 0, 200), folder="eval")  # a GIF alone: its first frame
        self.grid(6, (0, 0, 0), folder="eval")  # no row after 6 iterations: not logged
        result = self.track("--once")
        self.assertEqual(result.stderr, "")
        self.assertIn("4 new iterations (0..3), 2 new grids, 3 new evaluations (0, 2, 4), 3 new evaluation grids; "
                      "4 iterations and 2 grids, 3 evaluations and 3 evaluation grids logged in all", result.stdout)
        scalars, images = self.events()
        self.check_scalars(scalars, rows)
        self.check_evaluations(scalars, evaluations)
        self.assertEqual([image[0] for image in images], [1, 3])
        for (_, _, _, pixels), want in zip(images, leaves):
            np.testing.assert_array_equal(pixels, want)
        evaluation_images = self.events("eval/grid")[1]
        self.assertEqual([(step, w, h) for step, w, h, _ in evaluation_images], [(0, 12, 8), (2, 6, 4), (4, 12, 8)])
        for (_, _, _, pixels), want in zip(evaluation_images, (first, second, final)):
            np.testing.assert_array_equal(pixels, want)
        state = self.state()
        self.assertEqual((state["eval_scalars"], state["eval_images"]), ([[0, 0], [2, 2], [4, 4]],) * 2)
        # The final row and grids are there, [eval] is on: --follow ends at once; then nothing is written again.
        stdout, stderr = self.follow().communicate(timeout=20)
        self.assertIn("0 new iterations (none), 0 new grids, 0 new evaluations (none)", stdout)
        self.assertEqual(stderr, "")

    def test_follow_through_a_resume_logs_each_evaluation_once(self):
        self.config(iterations=4, grid_every=0, eval_every=2)
        evaluations = {0: eval_row(0), 2: eval_row(2)}
        self.append(line(evaluations[0]) + line(row(0)) + line(row(1)) + line(evaluations[2]))
        self.grid(0, (1, 1, 1), folder="eval")
        first_grid_2 = self.grid(2, (2, 2, 2), folder="eval")
        self.grid(4, (3, 3, 3), folder="eval")  # a grid of evaluation 4 from before the resume
        os.utime(os.path.join(self.run_dir, "eval", "iter-000004.png"), ns=(10**18, 10**18))
        process = self.follow()
        self.wait_for([[0, 1]], process, eval_scalars=[[0, 0], [2, 2]], eval_images=[[0, 0], [2, 2]])

        # train --resume from checkpoint iter-000002: the evaluation after 2 iterations is cut and written again
        # (already logged: kept as first seen, its new grid too), then iterations 2, 3 and the final evaluation.
        self.cut_after(1)
        self.append(line(eval_row(2, shift=100)))
        self.grid(2, (99, 99, 99), folder="eval")
        evaluations[4] = eval_row(4, shift=100)
        self.append(line(row(2)) + line(row(3)) + line(evaluations[4]))
        self.wait_for([[0, 3]], process, eval_scalars=[[0, 0], [2, 2], [4, 4]])
        time.sleep(0.3)  # the final evaluation's row is the last: the old grid is older than it, so not taken
        self.assertIsNone(process.poll(), "ended before the final evaluation's grid")
        self.assertEqual(self.state()["eval_images"], [[0, 0], [2, 2]])
        final = self.grid(4, (4, 44, 144), folder="eval")
        stdout, stderr = process.communicate(timeout=20)
        self.assertEqual((process.returncode, stderr), (0, ""))
        self.assertIn("4 new iterations (0..3), 0 new grids, 3 new evaluations (0, 2, 4), 3 new evaluation grids",
                      stdout)

        self.assertIn("0 new evaluations (none), 0 new evaluation grids", self.track("--once").stdout)
        scalars, _ = self.events()
        self.check_scalars(scalars, {i: row(i) for i in range(4)})
        self.check_evaluations(scalars, evaluations)
        images = self.events("eval/grid")[1]
        self.assertEqual([image[0] for image in images], [0, 2, 4])
        np.testing.assert_array_equal(images[1][3], first_grid_2)
        np.testing.assert_array_equal(images[2][3], final)

    def test_a_malformed_line_is_one_line_naming_file_and_line(self):
        self.config(iterations=10, grid_every=0)
        self.append(line(row(0)) + '{"iteration": 1, "reward_mean": \n' + '{"reward_mean": 0.5}\n' + "[1, 2]\n"
                    + line(row(1)) + '{"iteration": -3}\n' + line(row(2)) + '{"iteration": 3, "kind": "other"}\n')
        result = self.track("--once")
        messages = result.stderr.splitlines()
        self.assertEqual(len(messages), 5, result.stderr)
        for message, number in zip(messages, (2, 3, 4, 6, 8)):
            self.assertTrue(message.startswith("track.py: %s:%d: malformed line skipped: " % (self.metrics, number)),
                            message)
        self.assertTrue(messages[-1].endswith('unknown "kind" "other"'), messages[-1])
        self.check_scalars(self.events()[0], {i: row(i) for i in range(3)})

    def test_an_interrupted_batch_is_not_written_twice(self):
        self.config(iterations=10, grid_every=0, eval_every=4)
        self.append(line(eval_row(0)) + "".join(line(row(i)) for i in range(4)))
        self.track("--once")
        # As if track.py had been killed (SIGKILL) after writing the evaluation after 0 iterations and iterations
        # 2 and 3 but before recording them, and before writing the evaluation after 4 and iteration 4: the state
        # has those pending in the event file.
        path = os.path.join(self.logdir, "track_state.json")
        state = self.state()
        state["scalars"], state["eval_scalars"] = [[0, 1]], []
        state["pending"] = {"events": os.path.basename(self.event_files()[0]), "scalars": [[2, 4]], "images": [],
                            "eval_scalars": [[0, 0], [4, 4]]}
        with open(path, "w") as f:
            json.dump(state, f)
        self.append(line(eval_row(4)) + line(row(4)))
        result = self.track("--once")
        self.assertIn("recovered an interrupted batch: iterations 2..3 found in", result.stderr)
        self.assertIn("4 to be written again; evaluations 0 found, 4 to be written again", result.stderr)
        self.assertIn("1 new iteration (4), 0 new grids, 1 new evaluation (4)", result.stdout)
        scalars = self.events()[0]
        self.check_scalars(scalars, {i: row(i) for i in range(5)})
        self.check_evaluations(scalars, {0: eval_row(0), 4: eval_row(4)})
        self.assertEqual((self.state()["scalars"], self.state()["eval_scalars"]), ([[0, 4]], [[0, 0], [4, 4]]))

    def test_bad_arguments_and_missing_files(self):
        self.config(iterations=10, grid_every=0)
        result = self.track("--once", status=1)
        self.assertEqual(result.stderr, "track.py: %s: not found (has the run started?)\n" % self.metrics)
        result = self.track("--project", "p", status=2)
        self.assertIn("pass --wandb-offline WANDB_DIR too", result.stderr)
        result = subprocess.run([sys.executable, SCRIPT, os.path.join(self.root, "nothing"), "--tensorboard",
                                 self.logdir], capture_output=True, text=True, timeout=TIMEOUT)
        self.assertEqual(result.returncode, 2)
        self.assertIn("nothing: not a directory", result.stderr)

    def test_wandb_missing_is_one_line_with_the_pip_command(self):
        self.config(iterations=10, grid_every=0)
        self.append(line(row(0)))
        shim = os.path.join(self.root, "no-wandb", "wandb")
        os.makedirs(shim)
        with open(os.path.join(shim, "__init__.py"), "w") as f:
            f.write("raise ModuleNotFoundError(\"No module named 'wandb'\", name='wandb')\n")
        env = dict(self.env, PYTHONPATH=os.path.dirname(shim))
        result = self.track("--wandb-offline", os.path.join(self.root, "wandb"), status=1, env=env)
        self.assertEqual(len(result.stderr.splitlines()), 1, result.stderr)
        self.assertRegex(result.stderr, r"^track\.py: --wandb-offline needs wandb .*-m pip install .*'wandb==")

    def test_wandb_offline_run(self):
        probe = subprocess.run([sys.executable, "-c", "import wandb"], capture_output=True, env=self.env)
        if probe.returncode != 0:
            self.skipTest("wandb is not installed (optional: python3 -m pip install 'wandb==0.31.0')")
        self.config(iterations=10, grid_every=2, eval_every=2)
        self.append(line(eval_row(0)) + line(row(0)) + line(row(1)))
        self.grid(0, (6, 7, 8), folder="eval")
        self.grid(2, (3, 4, 5))
        wandb_dir = os.path.join(self.root, "wandb")
        self.track("--wandb-offline", wandb_dir, "--project", "p", "--name", "n", "--once")
        run_id = self.state()["wandb_id"]
        runs = glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*-%s" % run_id))
        self.assertEqual(len(runs), 1, os.listdir(os.path.join(wandb_dir, "wandb")))
        self.assertTrue(os.path.exists(os.path.join(runs[0], "run-%s.wandb" % run_id)))
        for name in ("grids/leaves", "eval/grid"):
            self.assertTrue(glob.glob(os.path.join(runs[0], "files", "media", "images", name + "_*.png")), name)
        scalars = self.events()[0]
        self.check_scalars(scalars, {0: row(0), 1: row(1)})
        self.check_evaluations(scalars, {0: eval_row(0)})


if __name__ == "__main__":
    unittest.main(verbosity=2)
