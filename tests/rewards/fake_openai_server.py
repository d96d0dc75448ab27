#!/usr/bin/env python3
"""A fake OpenAI-compatible chat-completions server for the tests of branchgrpo's VLM judge (Python stdlib only).

GET /v1/models lists --model. POST /v1/chat/completions checks the request's shape as the judge must send it (docs/rewards.md "VLM judge"):
model == --model; one user message whose content is an image_url part holding data:image/png;base64,<8-bit RGB
PNG> and a text part; max_tokens 1, temperature 0, logprobs true, top_logprobs an integer in [1, 20]. A request
of another shape is answered 400 {"error": {"message": "<what is wrong>"}}, an unknown model 404 (as vLLM does).

The answer's first-token top_logprobs follow the image, so that a test can predict the score exactly: with r the
mean red channel of the decoded PNG over 255, P(yes) = 0.05 + 0.8 r split over "Yes" (3/4) and " yes" (1/4),
P(no) = 0.85 - 0.8 r as "No", and "Maybe" 0.1; the judge's score is then (0.05 + 0.8 r) / 0.9. Only the first
top_logprobs entries (most probable first) are sent.

--log PATH appends one JSON line per valid request: {"question", "width", "height", "red"} (red: r above).
--fault MODE (tests only) answers every request so instead:
  fixed         "Yes" ln 0.6, "no" ln 0.2, "Maybe" ln 0.1 (the judge's score: 0.75)
  only-yes      "Yes" ln 0.7, "Sure" ln 0.2 (score 1)
  neither       "Maybe" ln 0.5, "The" ln 0.3 (no yes or no token)
  no-logprobs   a chat completion without logprobs
  garbage       a body that is not JSON
  http-500      500 {"error": {"message": "fake failure"}}
  slow:SECONDS  the image-derived answer after SECONDS
  exit          the process exits without answering
  endless       a 200 answer whose chunked body never ends

Usage: fake_openai_server.py --model NAME [--port 0] [--port-file PATH] [--log PATH] [--fault MODE]
"""
import argparse
import base64
import binascii
import http.server
import json
import math
import os
import struct
import sys
import threading
import time
import zlib

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def paeth(left, up, corner):
    estimate = left + up - corner
    a, b, c = abs(estimate - left), abs(estimate - up), abs(estimate - corner)
    return left if a <= b and a <= c else (up if b <= c else corner)


def decode_rgb_png(data):
    """(width, height, rows of RGB bytes) of an 8-bit RGB, non-interlaced PNG; ValueError for anything else."""
    if not data.startswith(PNG_SIGNATURE):
        raise ValueError("not a PNG (no signature)")
    at, header, compressed = 8, None, b""
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        at += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            compressed += body
        elif kind == b"IEND":
            break
    if header is None or header[2:5] != (8, 2, 0) or header[6] != 0:
        raise ValueError("not an 8-bit RGB non-interlaced PNG (IHDR %r)" % (header,))
    width, height = header[0], header[1]
    raw, stride, rows, previous = zlib.decompress(compressed), width * 3, [], bytearray(width * 3)
    for y in range(height):
        start = y * (stride + 1)
        kind, row = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            left = row[i - 3] if i >= 3 else 0
            corner = previous[i - 3] if i >= 3 else 0
            predicted = (0, left, previous[i], (left + previous[i]) // 2, paeth(left, previous[i], corner))[kind]
            row[i] = (row[i] + predicted) & 0xFF
        rows.append(row)
        previous = row
    return width, height, rows


def check_request(request, model):
    """(status, message) of a request of the wrong shape, else (200, (question, png bytes, top_logprobs))."""
    if not isinstance(request, dict):
        return 400, "the request is not a JSON object"
    if request.get("model") != model:
        return 404, "The model `%s` does not exist." % request.get("model")
    wanted = {"max_tokens": 1, "temperature": 0, "logprobs": True}
    for key, value in wanted.items():
        if key not in request or request[key] != value or type(request[key]) is not type(value):
            return 400, "%s must be %s, got %s" % (key, json.dumps(value), json.dumps(request.get(key)))
    top = request.get("top_logprobs")
    if type(top) is not int or not 1 <= top <= 20:
        return 400, "top_logprobs must be an integer in [1, 20], got %s" % json.dumps(top)
    messages = request.get("messages")
    if not isinstance(messages, list) or len(messages) != 1 or not isinstance(messages[0], dict):
        return 400, "messages must be one user message"
    if messages[0].get("role") != "user" or not isinstance(messages[0].get("content"), list):
        return 400, "the message must be role user with a list of content parts"
    parts = {part.get("type"): part for part in messages[0]["content"] if isinstance(part, dict)}
    if sorted(parts) != ["image_url", "text"] or len(messages[0]["content"]) != 2:
        return 400, "the content must be one image_url part and one text part"
    url = (parts["image_url"].get("image_url") or {}).get("url", "")
    prefix = "data:image/png;base64,"
    if not isinstance(url, str) or not url.startswith(prefix):
        return 400, "the image_url is not a data:image/png;base64 URL: %s" % str(url)[:40]
    if not isinstance(parts["text"].get("text"), str) or not parts["text"]["text"]:
        return 400, "the text part is empty"
    try:
        png = base64.b64decode(url[len(prefix):], validate=True)
    except binascii.Error as e:
        return 400, "the image is not base64: %s" % e
    return 200, (parts["text"]["text"], png, top)


def choice(top_logprobs):
    """One chat-completion choice whose first token carries these (token, logprob) pairs, most probable first."""
    listed = [{"token": t, "logprob": p, "bytes": list(t.encode())} for t, p in top_logprobs]
    first = listed[0] if listed else {"token": "Yes", "logprob": 0.0, "bytes": [89, 101, 115]}
    return {"index": 0, "message": {"role": "assistant", "content": first["token"]}, "finish_reason": "length",
            "logprobs": {"content": [dict(first, top_logprobs=listed)]}}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, status, body):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_endless(self):
        """A 200 answer whose body never ends (chunked), until the client leaves or 8 GiB are sent."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        piece = b'{"choices": [' + b" " * 65536
        try:
            for _ in range((8 << 30) // len(piece)):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True

    def do_GET(self):
        if self.path != "/v1/models":
            return self.send(404, {"error": {"message": "no route %s" % self.path}})
        self.send(200, {"object": "list", "data": [{"id": self.server.model, "object": "model", "owned_by": "fake"}]})

    def do_POST(self):
        request_bytes = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != "/v1/chat/completions":
            return self.send(404, {"error": {"message": "no route %s" % self.path}})
        fault = self.server.fault
        if fault == "exit":
            os._exit(3)
        if fault.startswith("slow:"):
            time.sleep(float(fault[5:]))
        if fault == "garbage":
            return self.send(200, b"<html>not json</html>")
        if fault == "endless":
            return self.send_endless()
        if fault == "http-500":
            return self.send(500, {"error": {"message": "fake failure"}})
        try:
            request = json.loads(request_bytes)
        except ValueError as e:
            return self.send(400, {"error": {"message": "the body is not JSON: %s" % e}})
        status, checked = check_request(request, self.server.model)
        if status != 200:
            return self.send(status, {"error": {"message": checked}})
        question, png, top = checked
        try:
            width, height, rows = decode_rgb_png(png)
        except (ValueError, zlib.error, struct.error) as e:
            return self.send(400, {"error": {"message": "the image: %s" % e}})
        red = sum(sum(row[0::3]) for row in rows) / (255.0 * width * height)
        if self.server.log:
            with self.server.lock, open(self.server.log, "a", encoding="utf-8") as f:
                f.write(json.dumps({"question": question, "width": width, "height": height, "red": red}) + "\n")
        yes, no = 0.05 + 0.8 * red, 0.85 - 0.8 * red
        pairs = {
            "fixed": [("Yes", math.log(0.6)), ("no", math.log(0.2)), ("Maybe", math.log(0.1))],
            "only-yes": [("Yes", math.log(0.7)), ("Sure", math.log(0.2))],
            "neither": [("Maybe", math.log(0.5)), ("The", math.log(0.3))],
        }.get(fault, [("Yes", math.log(0.75 * yes)), ("No", math.log(no)), (" yes", math.log(0.25 * yes)),
                      ("Maybe", math.log(0.1))])
        pairs = sorted(pairs, key=lambda pair: -pair[1])[:top]
        answer = {"id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
                  "model": self.server.model, "choices": [choice(pairs)]}
        if fault == "no-logprobs":
            del answer["choices"][0]["logprobs"]
        self.send(200, answer)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file")
    parser.add_argument("--log")
    parser.add_argument("--fault", default="")
    args = parser.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    server.model, server.log, server.fault, server.lock = args.model, args.log, args.fault, threading.Lock()
    if args.port_file:  # atomically: a reader sees no file or the whole number
        with open(args.port_file + ".tmp", "w", encoding="utf-8") as f:
            f.write("%d\n" % server.server_address[1])
        os.replace(args.port_file + ".tmp", args.port_file)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
