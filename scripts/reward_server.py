#!/usr/bin/env python3
"""The reward server of branchgrpo's `remote` reward: scores images and videos over HTTP (protocol v1).

branchgrpo trains in C++; reward models written in Python (HPS v2.1, PickScore, ImageReward, CLIP score, the
LAION aesthetic predictor, VideoAlign, ...) run here, in their own process and Python environment, and the
trainer sends them its leaves. The protocol (docs/rewards.md, "Remote rewards: the server protocol"), JSON over
HTTP/1.1, UTF-8:

  GET /info   -> {"protocol": 1, "scorers": [{"name", "version", "media", "groupwise", "components"}, ...]}
  POST /score {"protocol": 1, "scorer": NAME (optional with one scorer), "media": "image" | "video",
               "encoding": "png" | "float32", "items": [{"prompt", "prompt_index", "group", "leaf", "data"}, ...]}
              -> {"scores": [one finite number per item, in order], "components": {NAME: [...], ...}}
  errors      -> 400 (bad request) / 500 (scorer failure) / 404, 405, 413 with {"error": "<one line>"}

Scorers are plug-ins, one module each in scripts/reward_scorers/ listed in reward_scorers.SCORERS; a process runs
one or several (--scorer, repeatable). The core needs numpy and Pillow only; a scorer's heavy packages (torch,
transformers, open_clip, ImageReward) are imported when that scorer starts, and weights are read from local
paths only (HF_HUB_OFFLINE=1).

Usage:
  python3 scripts/reward_server.py --scorer shapes_alignment [--host 127.0.0.1] [--port 0] [--port-file PATH]
  python3 scripts/reward_server.py --scorer pickscore:model=/m/PickScore_v1,processor=/m/CLIP-ViT-H-14 \\
      --scorer hpsv2:checkpoint=/m/HPS_v2.1_compressed.pt --port 8700
  python3 scripts/reward_server.py --list-scorers

--fault MODE[@N] (tests only) breaks the answers from the N-th POST /score on (1-based, every POST /score
counted, default N = 1): slow:SECONDS, nan, null, garbage, string, wrong-count, http-500, exit, endless (a 200
answer whose body never ends: no Content-Length, bytes until the client leaves or ENDLESS_CAP_BYTES are sent),
endless-chunked (the same in chunked transfer encoding), huge-length (a Content-Length of 10 GB, then the same
endless body); and --fault fixed:PATH answers the k-th POST /score with the k-th list of scores of the JSON file
PATH.
"""
import argparse
import base64
import binascii
import http.server
import io
import json
import math
import numbers
import os
import signal
import socket
import socketserver
import sys
import threading
import time
import traceback
import urllib.parse

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reward_scorers  # noqa: E402  (the plug-ins sit beside this script)
from reward_scorers.scorer_api import BadItems, Item, ScorerStartupError  # noqa: E402

PROTOCOL = 1
MEDIA = ("image", "video")
ENCODINGS = ("png", "float32")
# Seconds a connection may stay silent mid-request (or idle between keep-alive requests) before it is closed,
# so a stalled client never holds a thread forever.
SOCKET_TIMEOUT_S = 120
FAULT_MODES = ("slow", "nan", "null", "garbage", "string", "wrong-count", "http-500", "exit", "endless",
               "endless-chunked", "huge-length", "fixed")
# The most an endless answer sends before it gives up (a client with no bound stops the test by its memory first).
ENDLESS_CAP_BYTES = 8 << 30


def one_line(text, limit=400):
    """`text` on one line (whitespace runs joined by one space), at most `limit` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


def shown(value, limit=60):
    """A JSON value as it appears in a message: '"audio"', '3', 'null', 'a list of 2'."""
    if isinstance(value, list):
        return "a list of %d" % len(value)
    if isinstance(value, dict):
        return "an object"
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


class RequestError(Exception):
    """An answer other than 200: the status and its one-line message."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def bad_request(message):
    return RequestError(400, one_line(message))


# ---- Faults (tests only) ---------------------------------------------------------------------------------------

class Fault:
    """--fault MODE[@N]: how the server misbehaves from the N-th POST /score on, for the client's tests.
    A malformed MODE raises ValueError with a one-line message."""

    def __init__(self, text):
        self.text = text
        self.first = 1
        self.seconds = 0.0
        self.answers = None
        mode, _, argument = text.partition(":")
        if mode == "fixed":
            # The whole rest is the path (it may hold '@'); fixed answers every request from the first.
            self.mode = "fixed"
            self.answers = self._read_answers(argument)
            return
        head, at, count = text.rpartition("@")
        if at:
            if not count.isdigit() or int(count) < 1:
                raise ValueError("--fault %s: N in MODE@N must be a positive integer, got '%s'" %
                                 (text, count))
            self.first = int(count)
            text = head
        mode, _, argument = text.partition(":")
        if mode not in FAULT_MODES:
            raise ValueError("--fault %s: unknown mode '%s' (modes: %s)" %
                             (self.text, mode, ", ".join(FAULT_MODES)))
        if mode == "fixed":
            raise ValueError("--fault %s: fixed is fixed:PATH, without @N" % self.text)
        if mode == "slow":
            try:
                self.seconds = float(argument)
            except ValueError:
                raise ValueError("--fault %s: slow needs slow:SECONDS, got '%s'" %
                                 (self.text, argument)) from None
            if not (math.isfinite(self.seconds) and self.seconds >= 0):
                raise ValueError("--fault %s: SECONDS must be >= 0, got '%s'" % (self.text, argument))
        elif argument:
            raise ValueError("--fault %s: mode %s takes no ':' argument" % (self.text, mode))
        self.mode = mode

    @staticmethod
    def _read_answers(path):
        try:
            with open(path, encoding="utf-8") as f:
                answers = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError("--fault fixed:%s: cannot read a JSON file: %s" % (path, one_line(e))) from None
        if not isinstance(answers, list) or not all(isinstance(a, list) for a in answers):
            raise ValueError("--fault fixed:%s: expected a list of lists of scores, one per request" % path)
        return answers

    def active(self, request_number):
        return request_number >= self.first


# ---- Decoding --------------------------------------------------------------------------------------------------

def decode_base64(text, what):
    if not isinstance(text, str):
        raise BadItems("%s is %s, expected a base64 string" % (what, shown(text)))
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise BadItems("%s is not base64 (%s)" % (what, one_line(e))) from None


def decode_png(text, what):
    """An 8-bit RGB PNG in base64 -> float64 [3, H, W], byte / 255 * 2 - 1."""
    raw = decode_base64(text, what)
    try:
        with Image.open(io.BytesIO(raw)) as image:
            if image.format != "PNG":
                raise BadItems("%s is not a PNG (it reads as %s)" % (what, image.format))
            if image.mode != "RGB":
                raise BadItems("%s is a PNG of mode %s, expected 8-bit RGB" % (what, image.mode))
            image.load()
            rgb = np.asarray(image, dtype=np.uint8)
    except BadItems:
        raise
    except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError, zlib.error... for broken files
        raise BadItems("%s is not a readable PNG (%s: %s)" % (what, type(e).__name__, one_line(e, 120))) from None
    return rgb.transpose(2, 0, 1).astype(np.float64) / 255.0 * 2.0 - 1.0


def decode_float32(data, rank, what):
    """{"shape": [...], "base64": little-endian float32 bytes, C order} -> float64 array of that shape."""
    expected = "[3, H, W]" if rank == 3 else "[F, 3, H, W]"
    if not isinstance(data, dict):
        raise BadItems("%s is %s, expected {\"shape\": %s, \"base64\": ...}" % (what, shown(data), expected))
    if "shape" not in data:
        raise BadItems("%s has no \"shape\"" % what)
    if "base64" not in data:
        raise BadItems("%s has no \"base64\"" % what)
    shape = data["shape"]
    if (not isinstance(shape, list) or len(shape) != rank or not all(type(n) is int for n in shape)
            or any(n < 1 for n in shape) or shape[-3] != 3):
        raise BadItems("%s shape is %s, expected %s with positive sizes" % (what, json.dumps(shape)[:80], expected))
    raw = decode_base64(data["base64"], what + " base64")
    needed = 4 * math.prod(shape)
    if len(raw) != needed:
        raise BadItems("%s holds %d bytes, shape %s needs %d" % (what, len(raw), json.dumps(shape), needed))
    pixels = np.frombuffer(raw, dtype="<f4").reshape(shape).astype(np.float64)
    if not np.isfinite(pixels).all():
        raise BadItems("%s holds a non-finite value (the client scores such items NaN itself and does not send "
                       "them)" % what)
    return pixels


def decode_item_data(data, media, encoding, what):
    if encoding == "float32":
        return decode_float32(data, 3 if media == "image" else 4, what)
    if media == "image":
        return decode_png(data, what)
    if not isinstance(data, list) or not data:
        raise BadItems("%s is %s, expected a non-empty list of base64 PNG frames" % (what, shown(data)))
    frames = [decode_png(frame, "%s frame %d" % (what, f)) for f, frame in enumerate(data)]
    for f, frame in enumerate(frames):
        if frame.shape != frames[0].shape:
            raise BadItems("%s frame %d is %d x %d (H x W), frame 0 is %d x %d" % (
                what, f, frame.shape[1], frame.shape[2], frames[0].shape[1], frames[0].shape[2]))
    return np.stack(frames)


# ---- Requests --------------------------------------------------------------------------------------------------

class RunningScorer:
    """One scorer of this process: its plug-in module, its instance, and a lock (model code is rarely
    thread-safe, and one GPU model gains nothing from concurrent calls)."""

    def __init__(self, module, instance):
        self.module = module
        self.instance = instance
        self.lock = threading.Lock()

    @property
    def name(self):
        return self.module.NAME

    def info(self):
        return {"name": self.module.NAME, "version": self.module.VERSION, "media": list(self.module.MEDIA),
                "groupwise": self.module.GROUPWISE, "components": list(self.module.COMPONENTS)}


def field(obj, key, kind, where):
    """obj[key], checked to be of `kind` ("string", "integer", "list"); 400 naming the field and its value."""
    if key not in obj:
        raise bad_request("%smissing field \"%s\"" % (where, key))
    value = obj[key]
    ok = {"string": lambda v: isinstance(v, str),
          "integer": lambda v: type(v) is int,  # not a bool, not 1.0
          "list": lambda v: isinstance(v, list)}[kind](value)
    if not ok:
        article = "an" if kind == "integer" else "a"
        raise bad_request("%s\"%s\" is %s, expected %s %s" % (where, key, shown(value), article, kind))
    return value


def parse_score_request(body, scorers):
    """(scorer, media, items) of a POST /score body; RequestError 400 naming what is wrong."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request("body is not UTF-8 (byte %d)" % e.start) from None
    try:
        request = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise bad_request("body is not JSON (%s)" % one_line(e, 120)) from None
    if not isinstance(request, dict):
        raise bad_request("body is %s, expected a JSON object" % shown(request))
    protocol = field(request, "protocol", "integer", "")
    if protocol != PROTOCOL:
        raise bad_request("\"protocol\" is %d; this server speaks protocol %d" % (protocol, PROTOCOL))
    names = [s.name for s in scorers]
    if "scorer" in request:
        name = field(request, "scorer", "string", "")
        matching = [s for s in scorers if s.name == name]
        if not matching:
            raise bad_request("unknown scorer %s (this server runs %s)" % (shown(name), ", ".join(names)))
        scorer = matching[0]
    elif len(scorers) == 1:
        scorer = scorers[0]
    else:
        raise bad_request("missing field \"scorer\": this server runs %s" % ", ".join(names))
    media = field(request, "media", "string", "")
    if media not in MEDIA:
        raise bad_request("\"media\" is %s, expected \"image\" or \"video\"" % shown(media))
    if media not in scorer.module.MEDIA:
        raise bad_request("scorer %s takes media %s, not %s" % (scorer.name, " or ".join(scorer.module.MEDIA), media))
    encoding = field(request, "encoding", "string", "")
    if encoding not in ENCODINGS:
        raise bad_request("\"encoding\" is %s, expected \"png\" or \"float32\"" % shown(encoding))
    entries = field(request, "items", "list", "")
    if not entries:
        raise bad_request("\"items\" is empty: nothing to score")
    items, seen = [], {}
    for index, entry in enumerate(entries):
        where = "item %d: " % index
        if not isinstance(entry, dict):
            raise bad_request("item %d is %s, expected an object" % (index, shown(entry)))
        prompt = field(entry, "prompt", "string", where)
        prompt_index = field(entry, "prompt_index", "integer", where)
        group = field(entry, "group", "integer", where)
        leaf = field(entry, "leaf", "integer", where)
        if "data" not in entry:
            raise bad_request(where + "missing field \"data\"")
        if (group, leaf) in seen:
            raise bad_request("item %d repeats group %d leaf %d of item %d" % (index, group, leaf, seen[group, leaf]))
        seen[group, leaf] = index
        try:
            pixels = decode_item_data(entry["data"], media, encoding, "item %d data" % index)
        except BadItems as e:
            raise bad_request(str(e)) from None
        items.append(Item(prompt=prompt, prompt_index=prompt_index, group=group, leaf=leaf, pixels=pixels,
                          index=index))
    return scorer, media, items


def checked_result(scorer, result, positions):
    """(scores, components) of a plug-in's answer for the items at `positions` of the request, as floats; 500
    naming what is wrong (and the item by its request position)."""
    count = len(positions)

    def failure(message):
        return RequestError(500, one_line("scorer %s %s" % (scorer.name, message)))

    if not (isinstance(result, tuple) and len(result) == 2):
        raise failure("returned %s, expected (scores, components)" % type(result).__name__)
    scores, components = result

    def finite_list(values, what):
        try:
            values = list(values)
        except TypeError:
            raise failure("returned a %s as %s, expected a list" % (type(values).__name__, what)) from None
        if len(values) != count:
            raise failure("returned %d values of %s for %d items" % (len(values), what, count))
        out = []
        for position, value in enumerate(values):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise failure("returned %r in %s for item %d" % (value, what, positions[position]))
            out.append(float(value))
        return out

    scores = finite_list(scores, "scores")
    checked = {}
    for name, values in (components or {}).items():
        if name not in scorer.module.COMPONENTS:
            raise failure("returned component %r, which it does not declare (%s)" %
                          (name, ", ".join(scorer.module.COMPONENTS) or "none"))
        checked[name] = finite_list(values, "component " + name)
    return scores, checked


def run_scorer(scorer, items):
    """Scores and components of `items` in their order. A groupwise scorer is called once per group with that
    group's items (in request order); any other once with all items."""
    if scorer.module.GROUPWISE:
        groups = {}
        for position, item in enumerate(items):
            groups.setdefault(item.group, []).append(position)
        batches = list(groups.values())
    else:
        batches = [list(range(len(items)))]
    scores = [0.0] * len(items)
    components = {}
    with scorer.lock:
        for positions in batches:
            try:
                result = scorer.instance.score([items[p] for p in positions])
            except BadItems as e:
                raise bad_request("scorer %s: %s" % (scorer.name, e)) from None
            except Exception as e:
                traceback.print_exc(file=sys.stderr)
                raise RequestError(500, one_line("scorer %s failed: %s: %s" % (scorer.name, type(e).__name__, e)))
            batch_scores, batch_components = checked_result(scorer, result, positions)
            if components and set(batch_components) != set(components):
                raise RequestError(500, "scorer %s returned different components for different groups" % scorer.name)
            for name, values in batch_components.items():
                column = components.setdefault(name, [0.0] * len(items))
                for p, value in zip(positions, values):
                    column[p] = value
            for p, value in zip(positions, batch_scores):
                scores[p] = value
    return scores, components


# ---- HTTP ------------------------------------------------------------------------------------------------------

class RewardServer(http.server.ThreadingHTTPServer):
    daemon_threads = True   # a stuck request never keeps the process from exiting
    block_on_close = False

    def __init__(self, address, scorers, fault, max_request_bytes, verbose):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.scorers = scorers
        self.fault = fault
        self.max_request_bytes = max_request_bytes
        self.verbose = verbose
        self._score_requests = 0
        self._count_lock = threading.Lock()
        super().__init__(address, RewardRequestHandler)

    def server_bind(self):
        # HTTPServer.server_bind also looks the host's name up (socket.getfqdn), which can stall for seconds on a
        # machine without DNS; the name is never used here.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def next_score_request(self):
        with self._count_lock:
            self._score_requests += 1
            return self._score_requests


class RewardRequestHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the client may send many requests on one connection
    server_version = "branchgrpo-reward-server/%d" % PROTOCOL
    timeout = SOCKET_TIMEOUT_S

    # -- answers

    def reply(self, status, payload=None, raw=None, allow_nan=False, close=False):
        if raw is None:
            raw = json.dumps(payload, allow_nan=allow_nan).encode("utf-8")
            content_type = "application/json"
        else:
            content_type = "text/plain; charset=utf-8"
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(raw)))
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(raw)
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            self.close_connection = True  # the client left; nothing to answer

    def reply_endless(self, mode):
        """--fault endless / endless-chunked / huge-length: a 200 answer that starts like the protocol's and never
        ends, until the client closes the connection or ENDLESS_CAP_BYTES are sent."""
        piece = b"0.5, " * 13107  # 64 KiB less 1 byte per 5
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if mode == "endless-chunked":
                self.send_header("Transfer-Encoding", "chunked")
            elif mode == "huge-length":
                self.send_header("Content-Length", str(10 ** 10))
            self.send_header("Connection", "close")
            self.close_connection = True
            self.end_headers()
            sent = 0
            opening = b'{"scores": ['
            while sent < ENDLESS_CAP_BYTES:
                data = opening + piece
                opening = b""
                if mode == "endless-chunked":
                    data = b"%x\r\n%s\r\n" % (len(data), data)
                self.wfile.write(data)
                sent += len(data)
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            self.close_connection = True  # the client stopped reading: what the fault is for

    def reply_error(self, status, message, close=False):
        self.error_line = one_line(message)  # for the log line log_request writes
        self.reply(status, {"error": self.error_line}, close=close)

    def send_error(self, code, message=None, explain=None):
        # http.server's own errors (malformed request line or headers, unsupported method): JSON as well.
        if message is None:
            message = self.responses.get(code, ("error",))[0]
        self.reply_error(code, message, close=True)

    def log_request(self, code="-", size="-"):
        # Quiet on success; one stderr line per refused request (-v: every request).
        status = int(code) if str(code).isdigit() else 0
        if self.server.verbose or status >= 400:
            error = getattr(self, "error_line", None)
            self.error_line = None
            self.log_message('"%s" %s%s', self.requestline, code, ": " + error if error and status >= 400 else "")

    def log_message(self, fmt, *args):
        message = fmt % args
        if "Request timed out" in message:  # an idle keep-alive connection closing: routine
            return
        sys.stderr.write("reward_server: %s %s\n" % (self.address_string(), one_line(message)))

    # -- routes

    def route(self):
        return urllib.parse.urlsplit(self.path).path

    def do_GET(self):
        path = self.route()
        if path == "/info":
            self.reply(200, {"protocol": PROTOCOL, "scorers": [s.info() for s in self.server.scorers]})
        elif path == "/score":
            self.reply_error(405, "GET /score: use POST /score", close=True)
        else:
            self.reply_error(404, "no such path %s (GET /info, POST /score)" % path, close=True)

    def do_POST(self):
        path = self.route()
        if path != "/score":
            status = 405 if path == "/info" else 404
            self.reply_error(status, "POST %s: the server answers GET /info and POST /score" % path, close=True)
            return
        try:
            body = self.read_body()
            if body is None:
                return
            self.answer_score(body)
        except RequestError as e:
            self.reply_error(e.status, str(e))
        except Exception as e:  # a bug here must still answer, and must not take the server down
            traceback.print_exc(file=sys.stderr)
            self.reply_error(500, "server error: %s: %s" % (type(e).__name__, e))

    def read_body(self):
        """The request body, or None when the connection was answered and closed (or the client left)."""
        if self.headers.get("Transfer-Encoding"):
            self.reply_error(400, "Transfer-Encoding %s is not supported: send Content-Length" %
                             self.headers["Transfer-Encoding"], close=True)
            return None
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            self.reply_error(400, "missing Content-Length", close=True)
            return None
        if not length_text.strip().isdigit():
            self.reply_error(400, "Content-Length is '%s', expected a byte count" % length_text, close=True)
            return None
        length = int(length_text)
        if length > self.server.max_request_bytes:
            self.reply_error(413, "request of %d bytes exceeds --max-request-bytes %d: send fewer items per "
                             "request" % (length, self.server.max_request_bytes), close=True)
            return None
        try:
            body = self.rfile.read(length)
        except (socket.timeout, ConnectionResetError):
            self.close_connection = True
            return None
        if len(body) != length:  # the client closed the connection mid-body
            self.close_connection = True
            return None
        return body

    def answer_score(self, body):
        number = self.server.next_score_request()
        fault = self.server.fault
        faulty = fault is not None and fault.active(number)
        if faulty and fault.mode == "exit":
            sys.stderr.write("reward_server: --fault exit: exiting with 3 on /score request %d\n" % number)
            sys.stderr.flush()
            os._exit(3)
        if faulty and fault.mode == "slow":
            time.sleep(fault.seconds)
        if faulty and fault.mode == "http-500":
            raise RequestError(500, "--fault http-500 on /score request %d" % number)
        if faulty and fault.mode in ("endless", "endless-chunked", "huge-length"):
            self.reply_endless(fault.mode)
            return
        if faulty and fault.mode == "garbage":
            self.reply(200, raw=b"<html>this is not JSON</html>\n")
            return
        scorer, _, items = parse_score_request(body, self.server.scorers)
        if faulty and fault.mode == "fixed":
            if number > len(fault.answers):
                raise RequestError(500, "--fault %s holds %d answers; this is /score request %d" %
                                   (fault.text, len(fault.answers), number))
            self.reply(200, {"scores": fault.answers[number - 1]}, allow_nan=True)
            return
        scores, components = run_scorer(scorer, items)
        if faulty:
            if fault.mode == "nan":
                scores[0] = float("nan")  # written as the bare token NaN, as Python's json does
            elif fault.mode == "null":
                scores[0] = None
            elif fault.mode == "string":
                scores[0] = "0.5"
            elif fault.mode == "wrong-count":
                scores = scores[:-1]
        answer = {"scores": scores}
        if components:
            answer["components"] = components
        self.reply(200, answer, allow_nan=faulty and fault.mode == "nan")


# ---- Main ------------------------------------------------------------------------------------------------------

def start_scorers(specs, verbose=False):
    """RunningScorer of each --scorer NAME[:key=value,...]; ScorerStartupError (one line) when one cannot start."""
    scorers = []
    for spec in specs:
        name, options = reward_scorers.parse_spec(spec)
        module = reward_scorers.load_module(name)
        if any(s.name == name for s in scorers):
            raise ScorerStartupError("--scorer %s given twice (one instance per scorer and process)" % name)
        try:
            instance = module.Scorer(options)
        except ScorerStartupError:
            raise
        except Exception as e:  # a model that fails to load: one line (-v: with the traceback above it)
            if verbose:
                traceback.print_exc(file=sys.stderr)
            raise ScorerStartupError("scorer %s failed to start: %s: %s" % (name, type(e).__name__, one_line(e)))
        scorers.append(RunningScorer(module, instance))
    return scorers


def write_port_file(path, port):
    """Writes the port to `path` atomically (a reader sees no file or the whole number, never half of it)."""
    temporary = "%s.%d.tmp" % (path, os.getpid())
    with open(temporary, "w", encoding="utf-8") as f:
        f.write("%d\n" % port)
    os.replace(temporary, path)


def main(argv=None):
    parser = argparse.ArgumentParser(description="branchgrpo's reward server (protocol v1, docs/rewards.md).")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port; 0 picks a free one (default 0)")
    parser.add_argument("--port-file", help="write the bound port to this file once listening (atomically)")
    parser.add_argument("--scorer", action="append", default=[], metavar="NAME[:key=value,...]",
                        help="a scorer to run, with its options; repeatable")
    parser.add_argument("--fault", metavar="MODE[@N]", help="tests only: misbehave from the N-th /score request on")
    parser.add_argument("--max-request-bytes", type=int, default=4 << 30,
                        help="refuse (413) request bodies larger than this (default 4 GiB)")
    parser.add_argument("--list-scorers", action="store_true", help="print the known scorers and exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every request to stderr")
    args = parser.parse_args(argv)

    if args.list_scorers:
        for name in reward_scorers.SCORERS:
            module = reward_scorers.load_module(name)
            print("%-22s version %-14s media %-12s%s" % (name, module.VERSION, "+".join(module.MEDIA),
                                                          " groupwise" if module.GROUPWISE else ""))
        return 0
    try:
        if not args.scorer:
            raise ScorerStartupError("no --scorer given (known: %s)" % ", ".join(reward_scorers.SCORERS))
        fault = Fault(args.fault) if args.fault else None
        scorers = start_scorers(args.scorer, args.verbose)
    except (ScorerStartupError, ValueError) as e:
        print("reward_server: error: %s" % one_line(e, 1000), file=sys.stderr)
        return 2
    try:
        server = RewardServer((args.host, args.port), scorers, fault, args.max_request_bytes, args.verbose)
    except OSError as e:
        print("reward_server: error: cannot listen on %s port %d: %s" % (args.host, args.port, one_line(e)),
              file=sys.stderr)
        return 2

    stop = threading.Event()
    stopped_by = []

    def on_signal(number, _frame):
        stopped_by.append(signal.Signals(number).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # serve_forever runs on a thread so that the main thread, where signals land, can call shutdown() (which
    # waits for serve_forever to return, and so would deadlock on serve_forever's own thread).
    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    serving.start()
    port = server.server_address[1]
    if args.port_file:
        write_port_file(args.port_file, port)
    host = "[%s]" % args.host if ":" in args.host else args.host
    print("reward_server: listening on http://%s:%d (protocol %d; scorers: %s)" %
          (host, port, PROTOCOL, ", ".join("%s %s" % (s.name, s.module.VERSION) for s in scorers)), flush=True)
    while not stop.wait(0.5):
        if not serving.is_alive():
            break
    server.shutdown()
    server.server_close()
    if args.port_file:
        try:
            os.remove(args.port_file)  # a stale port file would send the next client to a dead port
        except OSError:
            pass
    print("reward_server: stopped (%s)" % (stopped_by[0] if stopped_by else "server loop ended"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
