#!/usr/bin/env python3
"""Tests scripts/reward_server.py (protocol v1, docs/rewards.md) as a real process on a loopback port.

Each server starts on port 0 with --port-file and is waited for with a timeout; every test stops the processes
it started. Checked: GET /info; the shapes_alignment test scorer on float32 images against an independent
pure-Python transliteration of the C++ reward (measure_shape / shape_alignment in rewards.hpp) and against
values derived by hand (to 1e-12), and PNG against float32 (within the 8-bit quantisation); the decoding of
every media and encoding (pixel_mean); request order, groups and leaves (shapes_group_relative is groupwise);
every kind of bad request -> 400 with a one-line error naming the value; HTTP-level refusals; startup errors in
one line (unknown scorer, bad option, missing weights path, missing package); each --fault mode; SIGTERM and
SIGINT stop the server, even with a request in flight.

Usage: /usr/bin/python3 tests/rewards/test_reward_server.py  (needs python3-numpy and python3-pil)
"""
import base64
import http.client
import io
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

try:
    import numpy as np
    from PIL import Image
except ImportError as e:
    sys.exit("error: %s: this test needs numpy and Pillow (apt-get install python3-numpy python3-pil)" % e)

SERVER = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                                       "reward_server.py"))
START_TIMEOUT_S = 20
REQUEST_TIMEOUT_S = 20

# ---- An independent shape_alignment: the C++ loops of rewards.hpp written out in plain Python -------------------

PALETTE = [[0.90, 0.10, 0.10], [0.10, 0.75, 0.15], [0.15, 0.25, 0.95], [0.95, 0.85, 0.10]]
COLOURS = ["red", "green", "blue", "yellow"]
SHAPES = ["circle", "square", "triangle"]


def reference_shape_alignment(image, prompt, colour_weight=0.5, colour_width=0.2, fill_width=0.08,
                              fill_targets=(math.pi / 4, 1.0, 0.58)):
    """(r, s_colour, s_shape) of an image [3][H][W] of floats, transliterating measure_shape and
    shape_alignment::score (loop for loop, so that the sums run in the same order)."""
    words = prompt.lower().split()
    colour_index = next(COLOURS.index(w) for w in words if w in COLOURS)
    shape_index = next(SHAPES.index(w) for w in words if w in SHAPES)
    h, w = len(image[0]), len(image[0][0])
    a = [[[min(max((float(image[k][i][j]) + 1.0) / 2.0, 0.0), 1.0) for j in range(w)] for i in range(h)]
         for k in range(3)]

    def median(values):
        values = sorted(values)
        m = len(values)
        return values[m // 2] if m % 2 else (values[m // 2 - 1] + values[m // 2]) / 2

    b = []
    for k in range(3):
        border = []
        for j in range(w):
            border += [a[k][0][j], a[k][h - 1][j]]
        for i in range(1, h - 1):
            border += [a[k][i][0], a[k][i][w - 1]]
        b.append(median(border))
    distance = [[0.0] * w for _ in range(h)]
    farthest = 0.0
    for i in range(h):
        for j in range(w):
            squared = 0.0
            for k in range(3):
                squared += (a[k][i][j] - b[k]) * (a[k][i][j] - b[k])
            distance[i][j] = math.sqrt(squared)
            farthest = max(farthest, distance[i][j])
    if farthest < 0.25:
        return 0.0, 0.0, 0.0
    f = [median([a[k][i][j] for i in range(h) for j in range(w) if distance[i][j] >= 0.5 * farthest])
         for k in range(3)]
    axis = [f[k] - b[k] for k in range(3)]
    axis_squared = 0.0
    for k in range(3):
        axis_squared += axis[k] * axis[k]
    column_max, row_max, area = [0.0] * w, [0.0] * h, 0.0
    for i in range(h):
        for j in range(w):
            projection = 0.0
            for k in range(3):
                projection += (a[k][i][j] - b[k]) * axis[k]
            m = min(max((projection / axis_squared - 0.15) / 0.7, 0.0), 1.0)
            area += m
            column_max[j] = max(column_max[j], m)
            row_max[i] = max(row_max[i], m)
    width = height = 0.0
    for m in column_max:
        width += m
    for m in row_max:
        height += m
    fill = area / (width * height) if width * height > 0 else 0.0
    squared = 0.0
    for k in range(3):
        squared += (f[k] - PALETTE[colour_index][k]) * (f[k] - PALETTE[colour_index][k])
    s_colour = math.exp(-squared / (2 * colour_width * colour_width))
    gap = fill - fill_targets[shape_index]
    s_shape = math.exp(-gap * gap / (2 * fill_width * fill_width))
    return colour_weight * s_colour + (1 - colour_weight) * s_shape, s_colour, s_shape


# ---- Images ----------------------------------------------------------------------------------------------------

def canvas(grey=0.92, h=16, w=16):
    return np.full((3, h, w), 2 * grey - 1, dtype=np.float32)


def rectangle(colour, rows, columns, grey=0.92, h=16, w=16):
    """A solid rectangle (rows and columns are ranges) on grey; values as float32 pixels in [-1, 1]."""
    image = canvas(grey, h, w)
    for k in range(3):
        image[k, rows[0]:rows[1], columns[0]:columns[1]] = 2 * colour[k] - 1
    return image


def supersampled(colour, inside, grey=0.92, h=16, w=16, samples=4):
    """Each pixel the shape's 4 x 4-supersampled coverage c: v = c colour + (1 - c) grey."""
    offsets = (np.arange(samples) + 0.5) / samples
    ys = (np.arange(h)[:, None] + offsets[None, :]).reshape(-1)
    xs = (np.arange(w)[:, None] + offsets[None, :]).reshape(-1)
    cover = inside(ys[:, None], xs[None, :]).astype(np.float64)
    cover = cover.reshape(h, samples, w, samples).mean(axis=(1, 3))
    v = np.stack([cover * colour[k] + (1 - cover) * grey for k in range(3)])
    return (2 * v - 1).astype(np.float32)


def disc(colour, cy=8.0, cx=8.0, radius=4.5, **kwargs):
    return supersampled(colour, lambda y, x: (y - cy) ** 2 + (x - cx) ** 2 <= radius * radius, **kwargs)


def triangle(colour, cy=8.0, cx=8.0, half=5.0, **kwargs):
    # Apex up: rows cy - half .. cy + half, width growing linearly to 2 half at the base.
    return supersampled(colour, lambda y, x: (y >= cy - half) & (y <= cy + half) &
                        (np.abs(x - cx) <= (y - (cy - half)) / 2), **kwargs)


def noise(seed, h=16, w=16):
    return np.random.default_rng(seed).normal(0.3, 0.6, (3, h, w)).astype(np.float32)


def to_rgb8(image):
    """The client's 8-bit image: byte = round(255 clamp((x + 1) / 2, 0, 1)), halves up; [H, W, 3]."""
    v = np.clip((image.astype(np.float64) + 1.0) / 2.0, 0.0, 1.0)
    return np.floor(255.0 * v + 0.5).astype(np.uint8).transpose(1, 2, 0)


def png_bytes(rgb8, mode="RGB", fmt="PNG"):
    buffer = io.BytesIO()
    Image.fromarray(rgb8, "RGB").convert(mode).save(buffer, format=fmt)
    return buffer.getvalue()


def png_data(image):
    return base64.b64encode(png_bytes(to_rgb8(image))).decode("ascii")


def float32_data(array):
    array = np.ascontiguousarray(array, dtype="<f4")
    return {"shape": list(array.shape), "base64": base64.b64encode(array.tobytes()).decode("ascii")}


def png_pixels(image):
    """What the server decodes from png_data(image): byte / 255 * 2 - 1."""
    return to_rgb8(image).transpose(2, 0, 1).astype(np.float64) / 255.0 * 2.0 - 1.0


def item(prompt, data, group=0, leaf=0, prompt_index=0):
    return {"prompt": prompt, "prompt_index": prompt_index, "group": group, "leaf": leaf, "data": data}


def score_request(items, scorer="shapes_alignment", media="image", encoding="float32"):
    request = {"protocol": 1, "media": media, "encoding": encoding, "items": items}
    if scorer is not None:
        request["scorer"] = scorer
    return request


def strict_json(body):
    """json.loads that refuses NaN and Infinity, as a strict client parser does."""
    def refuse(token):
        raise ValueError("non-standard JSON token " + token)
    return json.loads(body, parse_constant=refuse)


# ---- Server processes ------------------------------------------------------------------------------------------

def server_environment(env=None):
    """The servers' environment: no .pyc files left in the source tree."""
    return dict(env if env is not None else os.environ, PYTHONDONTWRITEBYTECODE="1")


class ServerProcess:
    """scripts/reward_server.py on port 0, waited for through --port-file; stop() ends it (kill as a last resort)."""

    def __init__(self, *args, env=None):
        self.folder = tempfile.TemporaryDirectory(prefix="reward_server_test_")
        self.port_file = os.path.join(self.folder.name, "port")
        # Output goes to files, not pipes: a pipe nobody reads fills up and would block the server.
        self.stdout_path = os.path.join(self.folder.name, "stdout")
        self.stderr_path = os.path.join(self.folder.name, "stderr")
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen([sys.executable, SERVER, "--port", "0", "--port-file", self.port_file,
                                             *args], stdout=out, stderr=err, env=server_environment(env))
        deadline = time.monotonic() + START_TIMEOUT_S
        while not os.path.exists(self.port_file):
            if self.process.poll() is not None:
                error = self.output("stderr")
                self.folder.cleanup()
                raise AssertionError("server exited with %d before listening: %s" % (self.process.returncode,
                                                                                     error))
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError("server did not write %s within %d s" % (self.port_file, START_TIMEOUT_S))
            time.sleep(0.02)
        with open(self.port_file) as f:
            self.port = int(f.read())

    def output(self, stream):
        """What the server wrote so far to "stdout" or "stderr"."""
        with open(self.stdout_path if stream == "stdout" else self.stderr_path, "rb") as f:
            return f.read().decode(errors="replace")

    def request(self, method, path, body=None, headers=None, timeout=REQUEST_TIMEOUT_S):
        """(status, body bytes) of one request on a new connection."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def score(self, request):
        """The parsed 200 answer of POST /score."""
        status, body = self.request("POST", "/score", request)
        if status != 200:
            raise AssertionError("POST /score answered %d: %s" % (status, body.decode(errors="replace")))
        return strict_json(body)

    def stop(self, sig=signal.SIGTERM):
        """Ends the server (sig, then SIGKILL after 5 s); returns its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.folder.cleanup()
        return self.process.returncode


def raw_exchange(port, data, timeout=REQUEST_TIMEOUT_S):
    """Sends raw bytes and reads until the server closes: (status, body bytes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    reply = b"".join(chunks)
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def run_to_exit(*args, env=None):
    """(exit code, stdout, stderr) of a server expected to fail at start."""
    done = subprocess.run([sys.executable, SERVER, "--port", "0", *args], capture_output=True, text=True,
                          timeout=START_TIMEOUT_S, env=server_environment(env))
    return done.returncode, done.stdout, done.stderr


# ---- Tests -----------------------------------------------------------------------------------------------------

RED, GREEN, BLUE, YELLOW = PALETTE


class ShapesTestImages:
    """The images the shapes tests score: name -> (float32 [3, H, W] image, prompt)."""
    square = rectangle(RED, (5, 11), (5, 11))  # rows and columns 5..10, the doc's example
    cases = [
        ("red square as 'a red square'", square, "a red square"),
        ("red square as 'a red circle'", square, "a red circle"),
        ("red square as 'a blue square'", square, "a blue square"),
        ("green disc", disc(GREEN), "a green circle"),
        ("green disc as 'A GREEN Triangle'", disc(GREEN, cy=7.3, cx=9.1, radius=3.7), "A GREEN Triangle"),
        ("yellow triangle", triangle(YELLOW), "a yellow triangle"),
        ("blue disc on a dark 20 x 24", disc(BLUE, cy=9.5, cx=13.0, radius=5.0, grey=0.3, h=20, w=24),
         "a blue circle"),
        ("blank", canvas(0.84), "a red circle"),
        ("noise", noise(1), "a yellow square"),
        ("over-range values", rectangle((1.4, -0.3, 0.2), (3, 9), (4, 13)) * np.float32(1.2), "a red square"),
    ]


class RewardServerTest(unittest.TestCase):
    """Against one server running the three test scorers."""

    @classmethod
    def setUpClass(cls):
        cls.server = ServerProcess("--scorer", "shapes_alignment", "--scorer", "shapes_group_relative",
                                   "--scorer", "pixel_mean")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_info(self):
        status, body = self.server.request("GET", "/info")
        self.assertEqual(status, 200)
        self.assertEqual(strict_json(body), {"protocol": 1, "scorers": [
            {"name": "shapes_alignment", "version": "1", "media": ["image"], "groupwise": False,
             "components": ["colour", "shape"]},
            {"name": "shapes_group_relative", "version": "1", "media": ["image"], "groupwise": True,
             "components": ["alignment", "group_mean"]},
            {"name": "pixel_mean", "version": "1", "media": ["image", "video"], "groupwise": False,
             "components": ["frames", "height", "width"]}]})

    def test_shapes_alignment_matches_the_cpp_formula_on_float32(self):
        cases = ShapesTestImages.cases
        answer = self.server.score(score_request([item(prompt, float32_data(image), leaf=n)
                                                  for n, (_, image, prompt) in enumerate(cases)]))
        self.assertEqual(len(answer["scores"]), len(cases))
        for n, (name, image, prompt) in enumerate(cases):
            expected, colour, shape = reference_shape_alignment(image, prompt)
            self.assertAlmostEqual(answer["scores"][n], expected, delta=1e-12, msg=name)
            self.assertAlmostEqual(answer["components"]["colour"][n], colour, delta=1e-12, msg=name)
            self.assertAlmostEqual(answer["components"]["shape"][n], shape, delta=1e-12, msg=name)
        scores = answer["scores"]
        # By hand (docs/rewards.md's worked values). The square's colour is float32(2 c - 1): f differs from the
        # palette by ~6e-9, so s_colour = 1 - O(1e-15) for red; fill is exactly 36 / (6 x 6) = 1.
        self.assertAlmostEqual(scores[0], 1.0, delta=1e-12)
        self.assertAlmostEqual(scores[1], 0.5 + 0.5 * math.exp(-(1 - math.pi / 4) ** 2 / 0.0128), delta=1e-12)
        f = [(float(np.float32(2 * c - 1)) + 1) / 2 for c in RED]
        blue_squared = sum((f[k] - BLUE[k]) ** 2 for k in range(3))  # 0.5625 + 0.0225 + 0.7225 = 1.3075
        self.assertAlmostEqual(blue_squared, 1.3075, delta=1e-7)
        self.assertAlmostEqual(scores[2], 0.5 * math.exp(-blue_squared / 0.08) + 0.5, delta=1e-12)
        self.assertEqual(scores[7], 0.0)  # blank: no pixel 0.25 away from the background
        self.assertGreater(scores[3], 0.95)  # a rendered disc for its own prompt
        self.assertGreater(scores[5], 0.9)   # a rendered triangle for its own prompt
        self.assertGreater(scores[6], 0.95)

    def test_png_agrees_with_float32_within_quantisation(self):
        cases = ShapesTestImages.cases
        exact = self.server.score(score_request([item(p, float32_data(i), leaf=n)
                                                 for n, (_, i, p) in enumerate(cases)]))["scores"]
        eight_bit = self.server.score(score_request([item(p, png_data(i), leaf=n)
                                                     for n, (_, i, p) in enumerate(cases)], encoding="png"))["scores"]
        for n, (name, image, prompt) in enumerate(cases):
            # PNG decoding is exact: the reference on byte / 255 * 2 - 1 agrees to rounding.
            self.assertAlmostEqual(eight_bit[n], reference_shape_alignment(png_pixels(image), prompt)[0],
                                   delta=1e-12, msg=name)
            # 8 bits move a channel by at most 1/510; on these images the score moves by less than 5e-4.
            self.assertAlmostEqual(eight_bit[n], exact[n], delta=2e-3, msg=name)

    def test_order_groups_and_leaves_are_kept(self):
        cases = ShapesTestImages.cases
        expected_of = [reference_shape_alignment(image, prompt)[0] for _, image, prompt in cases]
        rng = random.Random(5)
        # Three trees with interleaved leaves, in a shuffled order; two requests on one keep-alive connection.
        placement = [(n, n % 3, n // 3) for n in range(len(cases))]
        connection = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=REQUEST_TIMEOUT_S)
        try:
            for _ in range(2):
                rng.shuffle(placement)
                request = score_request([item(cases[n][2], float32_data(cases[n][1]), group=g, leaf=l,
                                              prompt_index=n) for n, g, l in placement])
                connection.request("POST", "/score", body=json.dumps(request).encode())
                response = connection.getresponse()
                self.assertEqual(response.status, 200)
                scores = strict_json(response.read())["scores"]
                for position, (n, _, _) in enumerate(placement):
                    self.assertAlmostEqual(scores[position], expected_of[n], delta=1e-12)
        finally:
            connection.close()

    def test_groupwise_scorer_gets_each_group_whole(self):
        cases = ShapesTestImages.cases
        own = [reference_shape_alignment(image, prompt)[0] for _, image, prompt in cases]
        groups = [7, -2, 7, 40, -2, 7, 40, 40, -2, 7]  # interleaved, any integers
        items = [item(cases[n][2], float32_data(cases[n][1]), group=groups[n], leaf=n) for n in range(len(cases))]
        answer = self.server.score(score_request(items, scorer="shapes_group_relative"))
        for n in range(len(cases)):
            members = [own[m] for m in range(len(cases)) if groups[m] == groups[n]]
            mean = sum(members) / len(members)
            self.assertAlmostEqual(answer["scores"][n], own[n] - mean, delta=1e-12)
            self.assertAlmostEqual(answer["components"]["alignment"][n], own[n], delta=1e-12)
            self.assertAlmostEqual(answer["components"]["group_mean"][n], mean, delta=1e-12)

    def test_every_media_and_encoding_decodes(self):
        rng = np.random.default_rng(3)
        image = rng.uniform(-1, 1, (3, 5, 7)).astype(np.float32)
        video = rng.uniform(-1.2, 1.2, (4, 3, 6, 5)).astype(np.float32)

        def mean(values):
            return math.fsum(np.asarray(values, dtype=np.float64).ravel().tolist()) / np.asarray(values).size

        cases = [
            ("image", "float32", float32_data(image), mean(image), [1, 5, 7]),
            ("image", "png", png_data(image), mean(png_pixels(image)), [1, 5, 7]),
            ("video", "float32", float32_data(video), mean(video), [4, 6, 5]),
            ("video", "png", [png_data(frame) for frame in video], mean([png_pixels(f) for f in video]), [4, 6, 5]),
        ]
        for media, encoding, data, expected, sizes in cases:
            answer = self.server.score(score_request([item("any", data), item("any", data, leaf=1)],
                                                     scorer="pixel_mean", media=media, encoding=encoding))
            self.assertEqual(len(answer["scores"]), 2)
            for score in answer["scores"]:
                self.assertAlmostEqual(score, expected, delta=1e-12, msg=media + " " + encoding)
            c = answer["components"]
            self.assertEqual([c["frames"][0], c["height"][0], c["width"][0]], sizes, msg=media + " " + encoding)

    def test_concurrent_requests(self):
        image, prompt = ShapesTestImages.cases[3][1], ShapesTestImages.cases[3][2]
        expected = reference_shape_alignment(image, prompt)[0]
        results, errors = [], []

        def one():
            try:
                results.append(self.server.score(score_request([item(prompt, float32_data(image))]))["scores"][0])
            except Exception as e:  # reported below, in the test's thread
                errors.append(e)

        threads = [threading.Thread(target=one) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(REQUEST_TIMEOUT_S)
        self.assertEqual(errors, [])
        self.assertEqual(len(results), 6)
        for r in results:
            self.assertAlmostEqual(r, expected, delta=1e-12)

    def test_bad_requests_answer_400_with_one_line(self):
        good_image = ShapesTestImages.square
        good = item("a red square", float32_data(good_image))
        png = png_bytes(to_rgb8(good_image))

        def with_item(**changes):
            entry = dict(good, **changes)
            return score_request([{k: v for k, v in entry.items() if v is not None}])

        def without(key):
            return score_request([{k: v for k, v in good.items() if k != key}])

        def data_request(data, encoding="png", scorer="shapes_alignment", media="image", prompt="a red square"):
            return score_request([item(prompt, data)], scorer=scorer, media=media, encoding=encoding)

        short = float32_data(good_image)
        short["base64"] = base64.b64encode(np.zeros(767, "<f4").tobytes()).decode()
        not_finite = good_image.copy()
        not_finite[1, 2, 3] = np.inf
        two_scorers = score_request([good], scorer=None)
        wrong_sizes = [png_data(canvas(h=6, w=5)), png_data(canvas(h=6, w=6))]
        cases = [
            (b"{not json", "body is not JSON"),
            (b"\xff\xfe{}", "body is not UTF-8"),
            (b"[1, 2]", "body is a list of 2, expected a JSON object"),
            (b"[" * 100000, "body is not JSON"),
            ({}, 'missing field "protocol"'),
            (dict(score_request([good]), protocol=2), '"protocol" is 2; this server speaks protocol 1'),
            (dict(score_request([good]), protocol="1"), '"protocol" is "1", expected an integer'),
            (dict(score_request([good]), protocol=1.0), '"protocol" is 1.0, expected an integer'),
            (score_request([good], scorer="nope"), 'unknown scorer "nope" (this server runs shapes_alignment, '
                                                   'shapes_group_relative, pixel_mean)'),
            (two_scorers, 'missing field "scorer": this server runs shapes_alignment'),
            (score_request([good], media="audio"), '"media" is "audio", expected "image" or "video"'),
            (score_request([good], media="video"), "scorer shapes_alignment takes media image, not video"),
            (score_request([good], encoding="jpeg"), '"encoding" is "jpeg", expected "png" or "float32"'),
            ({"protocol": 1, "scorer": "shapes_alignment", "media": "image", "encoding": "png"},
             'missing field "items"'),
            (dict(score_request([good]), items={}), '"items" is an object, expected a list'),
            (score_request([]), '"items" is empty'),
            (score_request([good, 5]), "item 1 is 5, expected an object"),
            (without("prompt"), 'item 0: missing field "prompt"'),
            (without("leaf"), 'item 0: missing field "leaf"'),
            (without("data"), 'item 0: missing field "data"'),
            (with_item(prompt=3), 'item 0: "prompt" is 3, expected a string'),
            (with_item(prompt_index="3"), 'item 0: "prompt_index" is "3", expected an integer'),
            (with_item(group=True), 'item 0: "group" is true, expected an integer'),
            (with_item(leaf=1.5), 'item 0: "leaf" is 1.5, expected an integer'),
            (score_request([good, dict(good)]), "item 1 repeats group 0 leaf 0 of item 0"),
            (data_request("!!!"), "item 0 data is not base64"),
            (data_request(5), "item 0 data is 5, expected a base64 string"),
            (data_request(base64.b64encode(b"hello world").decode()), "item 0 data is not a readable PNG"),
            (data_request(base64.b64encode(png[:60]).decode()), "item 0 data is not a readable PNG"),
            (data_request(base64.b64encode(png_bytes(to_rgb8(good_image), mode="RGBA")).decode()),
             "item 0 data is a PNG of mode RGBA, expected 8-bit RGB"),
            (data_request(base64.b64encode(png_bytes(to_rgb8(good_image), mode="L")).decode()),
             "item 0 data is a PNG of mode L"),
            (data_request(base64.b64encode(png_bytes(to_rgb8(good_image), fmt="JPEG")).decode()),
             "item 0 data is not a PNG (it reads as JPEG)"),
            (data_request(short, encoding="float32"), "item 0 data holds 3068 bytes, shape [3, 16, 16] needs 3072"),
            (data_request(dict(short, shape=[16, 16]), encoding="float32"),
             "item 0 data shape is [16, 16], expected [3, H, W]"),
            (data_request(dict(short, shape=[4, 16, 12]), encoding="float32"),
             "item 0 data shape is [4, 16, 12], expected [3, H, W]"),
            (data_request(dict(short, shape=[3, 0, 16]), encoding="float32"), "item 0 data shape is [3, 0, 16]"),
            (data_request({"shape": [3, 16, 16]}, encoding="float32"), 'item 0 data has no "base64"'),
            (data_request("AAAA", encoding="float32"), 'item 0 data is "AAAA", expected {"shape": [3, H, W]'),
            (data_request(float32_data(not_finite), encoding="float32"), "item 0 data holds a non-finite value"),
            (data_request(float32_data(good_image), encoding="float32", prompt="a red dog"),
             "scorer shapes_alignment: item 0: prompt 'a red dog' names no shape (circle, square, triangle)"),
            (data_request(float32_data(good_image), encoding="float32", prompt="a square"),
             "names no colour (red, green, blue, yellow)"),
            (data_request(float32_data(canvas(h=2, w=16)), encoding="float32"),
             "scorer shapes_alignment: needs images of at least 3 x 3 pixels; item 0 is 2 x 16 (H x W)"),
            (data_request(png_data(good_image), media="video", scorer="pixel_mean"),
             "expected a non-empty list of base64 PNG frames"),
            (data_request([], media="video", scorer="pixel_mean"), "expected a non-empty list of base64 PNG"),
            (data_request(wrong_sizes, media="video", scorer="pixel_mean"),
             "item 0 data frame 1 is 6 x 6 (H x W), frame 0 is 6 x 5"),
            (data_request(["!"], media="video", scorer="pixel_mean"), "item 0 data frame 0 is not base64"),
            (data_request(float32_data(good_image), media="video", scorer="pixel_mean", encoding="float32"),
             "item 0 data shape is [3, 16, 16], expected [F, 3, H, W]"),
        ]
        for body, expected in cases:
            with self.subTest(expected=expected):
                status, reply = self.server.request("POST", "/score", body)
                self.assertEqual(status, 400, reply)
                answer = strict_json(reply)
                self.assertEqual(list(answer), ["error"])
                self.assertNotIn("\n", answer["error"])
                self.assertIn(expected, answer["error"])
        # Still serving.
        self.assertEqual(self.server.request("GET", "/info")[0], 200)

    def test_http_level_refusals(self):
        port = self.server.port
        for method, path, status in [("GET", "/nope", 404), ("GET", "/score", 405), ("POST", "/info", 405),
                                     ("POST", "/nope", 404), ("PUT", "/score", 501)]:
            got, body = self.server.request(method, path, b"{}" if method != "GET" else None)
            self.assertEqual(got, status, (method, path))
            self.assertNotIn("\n", strict_json(body)["error"])
        status, body = raw_exchange(port, b"POST /score HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        self.assertEqual((status, strict_json(body)), (400, {"error": "missing Content-Length"}))
        status, body = raw_exchange(port, b"POST /score HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                                          b"2\r\n{}\r\n0\r\n\r\n")
        self.assertEqual(status, 400)
        self.assertIn("Transfer-Encoding chunked is not supported", strict_json(body)["error"])
        status, body = raw_exchange(port, b"FETCH /score HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertEqual(status, 501)
        self.assertIn("Unsupported method ('FETCH')", strict_json(body)["error"])
        # Not HTTP at all: http.server takes a one-word line for HTTP/0.9, whose answer is the bare body.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"HELLO\r\n\r\n")
            reply = s.recv(65536)
        self.assertIn("Bad request syntax", strict_json(reply)["error"])
        # A client that leaves mid-body costs nothing.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"protocol\"")
        self.assertEqual(self.server.request("GET", "/info")[0], 200)


class ScorerAnswerCheckTest(unittest.TestCase):
    """In-process: the server refuses (500) a plug-in's answer that is not one finite score per item."""

    def test_bad_plugin_answers_are_500(self):
        sys.path.insert(0, os.path.dirname(SERVER))
        try:
            import reward_server
        finally:
            sys.path.pop(0)

        class Module:
            NAME, MEDIA, GROUPWISE, COMPONENTS = "fake", ["image"], False, ["part"]

        scorer = reward_server.RunningScorer(Module, None)
        positions = [4, 7]
        self.assertEqual(reward_server.checked_result(scorer, ([1, np.float32(0.5)], {"part": (2.0, 3)}), positions),
                         ([1.0, 0.5], {"part": [2.0, 3.0]}))
        for answer, message in [
                ([1.0, 2.0], "scorer fake returned list, expected (scores, components)"),
                (([1.0], {}), "scorer fake returned 1 values of scores for 2 items"),
                (([1.0, float("nan")], {}), "scorer fake returned nan in scores for item 7"),
                (([1.0, None], {}), "scorer fake returned None in scores for item 7"),
                (([True, 1.0], {}), "scorer fake returned True in scores for item 4"),
                ((0.5, {}), "scorer fake returned a float as scores, expected a list"),
                (([1.0, 2.0], {"other": [1.0, 2.0]}), "scorer fake returned component 'other', which it does not "
                                                      "declare (part)"),
                (([1.0, 2.0], {"part": [1.0, math.inf]}), "scorer fake returned inf in component part for item 7")]:
            with self.subTest(message=message):
                with self.assertRaises(reward_server.RequestError) as caught:
                    reward_server.checked_result(scorer, answer, positions)
                self.assertEqual((caught.exception.status, str(caught.exception)), (500, message))


class OneScorerTest(unittest.TestCase):
    def test_scorer_is_optional_options_apply_and_large_bodies_are_refused(self):
        server = ServerProcess("--scorer", "shapes_alignment:colour_weight=1,fill_width=0.1",
                               "--max-request-bytes", "20000")
        try:
            image = ShapesTestImages.square
            answer = server.score(score_request([item("a red circle", float32_data(image))], scorer=None))
            expected = reference_shape_alignment(image, "a red circle", colour_weight=1.0, fill_width=0.1)[0]
            self.assertAlmostEqual(answer["scores"][0], expected, delta=1e-12)
            self.assertAlmostEqual(answer["scores"][0], 1.0, delta=1e-12)  # colour only: the shape does not count
            big = score_request([item("a red square", float32_data(image), leaf=n) for n in range(10)])
            status, body = server.request("POST", "/score", big)
            self.assertEqual(status, 413)
            self.assertIn("exceeds --max-request-bytes 20000", strict_json(body)["error"])
        finally:
            server.stop()


class StartupErrorTest(unittest.TestCase):
    def test_startup_errors_are_one_line(self):
        with tempfile.TemporaryDirectory() as folder:
            stub = os.path.join(folder, "stub")
            os.mkdir(stub)
            with open(os.path.join(stub, "torch.py"), "w") as f:
                f.write("raise ImportError(\"No module named 'torch' (test stub)\")\n")
            weights = os.path.join(folder, "weights")
            os.mkdir(weights)
            no_torch = dict(os.environ, PYTHONPATH=stub)
            cases = [
                ([], "no --scorer given"),
                (["--scorer", "nope"], "unknown scorer 'nope' (known: shapes_alignment"),
                (["--scorer", "shapes_alignment:bogus=1"], "shapes_alignment has no option 'bogus'"),
                (["--scorer", "shapes_alignment:colour_weight"], "option 'colour_weight' is not key=value"),
                (["--scorer", "shapes_alignment:colour_weight=2"], "colour_weight must be in [0, 1], got 2"),
                (["--scorer", "shapes_alignment:fill_width=0"], "fill_width must be positive, got 0"),
                (["--scorer", "shapes_alignment:colour_width=abc"], "option colour_width=abc is not a number"),
                (["--scorer", "shapes_alignment", "--scorer", "shapes_alignment"], "given twice"),
                (["--scorer", "hpsv2"], "hpsv2 needs option checkpoint=PATH"),
                (["--scorer", "hpsv2:checkpoint=/nonexistent/HPS_v2.1_compressed.pt"],
                 "hpsv2 option checkpoint=/nonexistent/HPS_v2.1_compressed.pt: no such file or folder"),
                (["--scorer", "pickscore:model=/nonexistent/PickScore_v1,processor=/nonexistent/CLIP-ViT-H-14"],
                 "pickscore option model=/nonexistent/PickScore_v1: no such file or folder"),
                (["--scorer", "pickscore:model=%s" % weights], "pickscore needs option processor=PATH"),
                (["--scorer", "imagereward:model=/nonexistent/ImageReward.pt,med_config=/x.json"],
                 "imagereward option model=/nonexistent/ImageReward.pt"),
                (["--scorer", "clip_score:model=/nonexistent/clip"], "clip_score option model=/nonexistent/clip"),
                (["--scorer", "aesthetic:clip=/nonexistent/clip,predictor=/p.pth"],
                 "aesthetic option clip=/nonexistent/clip"),
                (["--scorer", "pickscore:model=%s,processor=%s" % (weights, weights)],
                 "pickscore needs the Python package 'torch'", no_torch),
                (["--scorer", "clip_score:model=%s" % weights], "clip_score needs the Python package 'torch'",
                 no_torch),
                (["--scorer", "video_align"], "clone https://github.com/KwaiVGI/VideoAlign"),
                (["--scorer", "shapes_alignment", "--fault", "bogus"], "unknown mode 'bogus'"),
                (["--scorer", "shapes_alignment", "--fault", "slow:soon"], "slow needs slow:SECONDS"),
                (["--scorer", "shapes_alignment", "--fault", "nan@0"], "N in MODE@N must be a positive integer"),
                (["--scorer", "shapes_alignment", "--fault", "fixed:/nonexistent/answers.json"], "cannot read"),
                (["--scorer", "shapes_alignment", "--fault", "fixed@2"], "fixed is fixed:PATH, without @N"),
            ]
            for case in cases:
                args, expected = case[0], case[1]
                env = case[2] if len(case) > 2 else None
                with self.subTest(args=args):
                    code, out, err = run_to_exit(*args, env=env)
                    self.assertEqual(code, 2, err)
                    lines = err.strip().splitlines()
                    self.assertEqual(len(lines), 1, err)
                    self.assertTrue(lines[0].startswith("reward_server: error: "), err)
                    self.assertIn(expected, lines[0])


class FaultTest(unittest.TestCase):
    """Each --fault mode, from the request it names on."""
    images = [ShapesTestImages.square, disc(GREEN), triangle(YELLOW)]
    prompts = ["a red square", "a green circle", "a yellow triangle"]

    def request(self):
        return score_request([item(p, float32_data(i), leaf=n)
                              for n, (i, p) in enumerate(zip(self.images, self.prompts))], scorer=None)

    def expected(self):
        return [reference_shape_alignment(i, p)[0] for i, p in zip(self.images, self.prompts)]

    def check_normal(self, status, body):
        self.assertEqual(status, 200)
        scores = strict_json(body)["scores"]
        for got, want in zip(scores, self.expected()):
            self.assertAlmostEqual(got, want, delta=1e-12)

    def with_fault(self, fault, check):
        server = ServerProcess("--scorer", "shapes_alignment", "--fault", fault)
        try:
            check(server)
        finally:
            server.stop()

    def test_slow(self):
        def check(server):
            start = time.monotonic()
            self.check_normal(*server.request("POST", "/score", self.request()))
            self.assertLess(time.monotonic() - start, 0.8)
            start = time.monotonic()
            self.check_normal(*server.request("POST", "/score", self.request()))
            self.assertGreaterEqual(time.monotonic() - start, 0.8)
        self.with_fault("slow:0.8@2", check)

    def test_nan(self):
        def check(server):
            self.check_normal(*server.request("POST", "/score", self.request()))
            status, body = server.request("POST", "/score", self.request())
            self.assertEqual(status, 200)
            self.assertIn(b"NaN", body)
            with self.assertRaises(ValueError):
                strict_json(body)
            scores = json.loads(body)["scores"]
            self.assertTrue(math.isnan(scores[0]))
            self.assertAlmostEqual(scores[1], self.expected()[1], delta=1e-12)
        self.with_fault("nan@2", check)

    def test_null_string_and_wrong_count(self):
        for fault, check_scores in [
                ("null", lambda s: self.assertIsNone(s[0])),
                ("string", lambda s: self.assertEqual(s[0], "0.5")),
                ("wrong-count", lambda s: self.assertEqual(len(s), 2))]:
            with self.subTest(fault=fault):
                def check(server):
                    status, body = server.request("POST", "/score", self.request())
                    self.assertEqual(status, 200)
                    scores = strict_json(body)["scores"]
                    check_scores(scores)
                    self.assertAlmostEqual(scores[1], self.expected()[1], delta=1e-12)
                self.with_fault(fault, check)

    def test_garbage(self):
        def check(server):
            status, body = server.request("POST", "/score", self.request())
            self.assertEqual(status, 200)
            with self.assertRaises(ValueError):
                json.loads(body)
            self.assertEqual(server.request("GET", "/info")[0], 200)  # /info is never faulted
        self.with_fault("garbage", check)

    def test_http_500(self):
        def check(server):
            self.check_normal(*server.request("POST", "/score", self.request()))
            self.check_normal(*server.request("POST", "/score", self.request()))
            status, body = server.request("POST", "/score", self.request())
            self.assertEqual(status, 500)
            self.assertEqual(strict_json(body), {"error": "--fault http-500 on /score request 3"})
        self.with_fault("http-500@3", check)

    def test_exit(self):
        def check(server):
            self.check_normal(*server.request("POST", "/score", self.request()))
            with self.assertRaises((http.client.HTTPException, ConnectionError)):
                server.request("POST", "/score", self.request())
            self.assertEqual(server.process.wait(timeout=10), 3)
        self.with_fault("exit@2", check)

    def test_fixed_answers_are_bit_exact(self):
        answers = [[0.1, 5e-324, -1.7976931348623157e308], [0.30000000000000004, 1e-300, -0.0], [123.456]]
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "answers@1.json")  # an '@' in the path is part of the path
            with open(path, "w") as f:
                json.dump(answers, f)

            def check(server):
                for expected in answers:
                    status, body = server.request("POST", "/score", self.request())
                    self.assertEqual(status, 200)
                    got = strict_json(body)["scores"]
                    self.assertEqual([float(v).hex() for v in got], [float(v).hex() for v in expected])
                status, body = server.request("POST", "/score", self.request())
                self.assertEqual(status, 500)
                self.assertIn("holds 3 answers; this is /score request 4", strict_json(body)["error"])
                # A bad request is still refused as such.
                self.assertEqual(server.request("POST", "/score", b"{")[0], 400)
            self.with_fault("fixed:" + path, check)


class SignalTest(unittest.TestCase):
    def test_sigterm_and_sigint_stop_the_server(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            with self.subTest(signal=sig.name):
                server = ServerProcess("--scorer", "shapes_alignment")
                port_file = server.port_file
                process = server.process
                process.send_signal(sig)
                self.assertEqual(process.wait(timeout=10), 0)
                out = server.output("stdout")
                self.assertIn("listening on http://127.0.0.1:%d" % server.port, out)
                self.assertIn("stopped (%s)" % sig.name, out)
                self.assertFalse(os.path.exists(port_file))
                server.stop()

    def test_sigterm_with_a_request_in_flight(self):
        server = ServerProcess("--scorer", "shapes_alignment", "--fault", "slow:30")
        try:
            request = score_request([item("a red square", float32_data(ShapesTestImages.square))], scorer=None)
            outcome = []

            def client():
                try:
                    outcome.append(server.request("POST", "/score", request, timeout=15))
                except Exception as e:  # the server closing the connection is the expected end
                    outcome.append(e)

            thread = threading.Thread(target=client)
            thread.start()
            time.sleep(0.3)
            start = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            self.assertEqual(server.process.wait(timeout=10), 0)
            self.assertLess(time.monotonic() - start, 5)
            thread.join(15)
            self.assertEqual(len(outcome), 1)
            self.assertIsInstance(outcome[0], Exception)
        finally:
            server.stop()


if __name__ == "__main__":
    unittest.main(verbosity=1)
