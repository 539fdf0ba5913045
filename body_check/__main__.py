"""python -m body_check --triton-http 127.0.0.1:18000 --triton-grpc 127.0.0.1:18001
--http-listen 127.0.0.1:18004 --grpc-listen 127.0.0.1:18005 --stream-listen 127.0.0.1:18009
--max-body-size 8m [--workers N]

Each process serves both protocols: the front door's inference routes come here, every other
route goes to Triton directly. With ``--workers N``, N processes bind the same three ports
(SO_REUSEPORT) and the kernel spreads the door's connections over them, so the check's CPU
scales with cores; if one dies, the others are stopped and the command exits 1, for whatever
runs it (the launcher, compose, the kubelet) to start it again.
"""

from __future__ import annotations

import argparse
import logging
import sys

from body_check.proxy import CheckSettings
from body_check.server import Listen, serve_many, serve_one
from python_backend.common.values import BadValue, nginx_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the KServe body check in front of Triton")
    parser.add_argument("--triton-http", default="127.0.0.1:18000", help="Triton's HTTP host:port")
    parser.add_argument("--triton-grpc", default="127.0.0.1:18001", help="Triton's gRPC host:port")
    parser.add_argument("--http-listen", default="127.0.0.1:18004", help="host:port for HTTP")
    parser.add_argument(
        "--grpc-listen", default="127.0.0.1:18005", help="host:port for gRPC ModelInfer"
    )
    parser.add_argument(
        "--stream-listen", default="127.0.0.1:18009", help="host:port for gRPC ModelStreamInfer"
    )
    parser.add_argument(
        "--stream-message-size",
        default="256k",
        help="the largest ModelStreamInfer message; each open stream holds this much of "
        "--grpc-bytes-in-progress, and a client as many as fit in two of --max-body-size",
    )
    parser.add_argument(
        "--max-body-size", default="8m", help="the front door's MAX_BODY_SIZE (like 8m or 512k)"
    )
    parser.add_argument(
        "--grpc-bytes-in-progress",
        default="1024m",
        help="gRPC request messages being received, in all, counted at --max-body-size each "
        "(a client may hold two; reads past it wait), and open streams",
    )
    parser.add_argument(
        "--body-deadline-s",
        type=float,
        default=30.0,
        help="seconds a ModelInfer message has to arrive whole, from the call's start",
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="processes sharing the ports (SO_REUSEPORT)"
    )
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    try:
        max_body = nginx_size(args.max_body_size, "--max-body-size")
        in_progress = nginx_size(args.grpc_bytes_in_progress, "--grpc-bytes-in-progress")
        stream_message = nginx_size(args.stream_message_size, "--stream-message-size")
    except BadValue as err:
        parser.error(str(err))
    if stream_message < 1:
        parser.error("--stream-message-size must be at least 1 byte")
    if not args.body_deadline_s > 0:
        parser.error("--body-deadline-s must be above 0")
    settings = CheckSettings(
        args.triton_http,
        args.triton_grpc,
        max_body,
        grpc_bytes_in_progress=in_progress,
        body_deadline_s=args.body_deadline_s,
        stream_message_bytes=stream_message,
    )
    listen = Listen(args.http_listen, args.grpc_listen, args.stream_listen)
    if args.workers == 1:
        serve_one(settings, listen)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    return serve_many(settings, listen, args.workers)


if __name__ == "__main__":
    sys.exit(main())
