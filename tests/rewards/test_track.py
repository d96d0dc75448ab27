#!/usr/bin/env python3
"""Tests scripts/track.py (experiment tracking as a sidecar; docs/cli.md, "Experiment tracking").

Each test builds a fake `branchgrpo train` output directory in a temporary folder: config.toml ([run]
iterations, grid_every), metrics.jsonl with the real keys (nlohmann's compact, sorted dump; a NaN as null) and
grids/iter-NNNNNN.png (N = iterations completed: the leaves of iteration N - 1) written with Pillow. track.py runs
as a subprocess; its event files are read back with tensorboard's own EventAccumulator and every scalar is
checked exactly (value as float32, step = the line's "iteration", each step once), and every image (step, size,
pixels). Resume is simulated as train does it (metrics.jsonl cut in place after the checkpoint's iteration, then
appended, the grids rewritten), while track.py follows the file and across restarts of track.py. wandb: the
offline run is checked when wandb is importable, else that test is skipped; its missing-package line always is.

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
    def config(self, iterations, grid_every):
        with open(os.path.join(self.run_dir, "config.toml"), "w") as f:
            f.write("[model]\ndir = \"models/shapes-tiny\"\n\n[run]\niterations = %d\ngrid_every = %d\n"
                    "output_dir = \"%s\"\n" % (iterations, grid_every, self.run_dir))

    def append(self, text):
        with open(self.metrics, "a") as f:
            f.write(text)

    def cut_after(self, iteration):
        """train --resume from checkpoint iter-(iteration + 1): the lines of iterations <= iteration are kept."""
        with open(self.metrics, "rb") as f:
            lines = f.read().split(b"\n")
        kept = [l for l in lines[:-1] if json.loads(l)["iteration"] <= iteration]
        os.truncate(self.metrics, sum(len(l) + 1 for l in kept))

    def grid(self, completed, colour, size=(12, 8), gif_second=None):
        """grids/iter-<completed>.png (or a 2-frame .gif when gif_second is a colour), written as train does: into
        a temporary name, then renamed."""
        path = os.path.join(self.grids, "iter-%06d.%s" % (completed, "gif" if gif_second else "png"))
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

    def wait_for(self, scalars, process, images=None):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            state = self.state()
            if state and state["scalars"] == scalars and (images is None or state["images"] == images):
                return
            if process.poll() is not None:
                self.fail("track.py --follow ended early: %s" % (process.communicate(),))
            time.sleep(0.05)
        self.fail("track.py did not log %s (state: %s)" % (scalars, self.state()))

    def events(self):
        """{tag: [(step, value)]} and [(step, width, height, pixels)] as TensorBoard reads LOGDIR."""
        accumulator = event_accumulator.EventAccumulator(
            self.logdir, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.IMAGES: 0})
        accumulator.Reload()
        tags = accumulator.Tags()
        scalars = {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in tags["scalars"]}
        images = []
        for tag in tags["images"]:
            self.assertEqual(tag, "grids/leaves")
            for e in accumulator.Images(tag):
                pixels = np.asarray(Image.open(io.BytesIO(e.encoded_image_string)).convert("RGB"))
                images.append((e.step, e.width, e.height, pixels))
        return scalars, sorted(images, key=lambda image: image[0])

    def check_scalars(self, scalars, expected):
        """expected: {iteration: row}; each tag has each step once, in step order, with the row's value."""
        self.assertEqual(set(scalars), set(KEYS))
        for key in KEYS:
            want = [(i, f32(j[key])) for i, j in sorted(expected.items()) if j.get(key) is not None]
            self.assertEqual(sorted(scalars[key]), want, key)

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

    def test_a_malformed_line_is_one_line_naming_file_and_line(self):
        self.config(iterations=10, grid_every=0)
        self.append(line(row(0)) + '{"iteration": 1, "reward_mean": \n' + '{"reward_mean": 0.5}\n' + "[1, 2]\n"
                    + line(row(1)) + '{"iteration": -3}\n' + line(row(2)))
        result = self.track("--once")
        messages = result.stderr.splitlines()
        self.assertEqual(len(messages), 4, result.stderr)
        for message, number in zip(messages, (2, 3, 4, 6)):
            self.assertTrue(message.startswith("track.py: %s:%d: malformed line skipped: " % (self.metrics, number)),
                            message)
        self.check_scalars(self.events()[0], {i: row(i) for i in range(3)})

    def test_an_interrupted_batch_is_not_written_twice(self):
        self.config(iterations=10, grid_every=0)
        self.append("".join(line(row(i)) for i in range(4)))
        self.track("--once")
        # As if track.py had been killed (SIGKILL) after writing iterations 2 and 3 but before recording them,
        # and before writing 4: the state has 2..4 pending in the event file.
        path = os.path.join(self.logdir, "track_state.json")
        state = self.state()
        state["scalars"] = [[0, 1]]
        state["pending"] = {"events": os.path.basename(self.event_files()[0]), "scalars": [[2, 4]], "images": []}
        with open(path, "w") as f:
            json.dump(state, f)
        self.append(line(row(4)))
        result = self.track("--once")
        self.assertIn("recovered an interrupted batch: iterations 2..3 found in", result.stderr)
        self.assertIn("4 to be written again", result.stderr)
        self.assertIn("1 new iteration (4)", result.stdout)
        self.check_scalars(self.events()[0], {i: row(i) for i in range(5)})
        self.assertEqual(self.state()["scalars"], [[0, 4]])

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
        self.config(iterations=10, grid_every=2)
        self.append(line(row(0)) + line(row(1)))
        self.grid(2, (3, 4, 5))
        wandb_dir = os.path.join(self.root, "wandb")
        self.track("--wandb-offline", wandb_dir, "--project", "p", "--name", "n", "--once")
        run_id = self.state()["wandb_id"]
        runs = glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*-%s" % run_id))
        self.assertEqual(len(runs), 1, os.listdir(os.path.join(wandb_dir, "wandb")))
        self.assertTrue(os.path.exists(os.path.join(runs[0], "run-%s.wandb" % run_id)))
        self.assertTrue(glob.glob(os.path.join(runs[0], "files", "media", "images", "grids", "leaves_*.png")))
        self.check_scalars(self.events()[0], {0: row(0), 1: row(1)})


if __name__ == "__main__":
    unittest.main(verbosity=2)
