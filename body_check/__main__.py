"""python -m body_check --triton-http 127.0.0.1:18000 --triton-grpc 127.0.0.1:18001
--http-listen 127.0.0.1:18004 --grpc-listen 127.0.0.1:18005 --max-body-size 8m

One process serves both: the front door's inference routes come here, every other route goes
to Triton directly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys

import grpc.aio
from aiohttp import web

from body_check.proxy import CheckSettings, GrpcCheck, HttpCheck
from python_backend.values import BadValue, nginx_size


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host or "127.0.0.1", int(port)


async def serve(settings: CheckSettings, http_listen: str, grpc_listen: str) -> None:
    runner = web.AppRunner(HttpCheck(settings).app(), handle_signals=False, access_log=None)
    await runner.setup()
    host, port = split_address(http_listen)
    await web.TCPSite(runner, host, port, reuse_port=True).start()
    size = settings.max_body_bytes
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", size),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 1),
        ]
    )
    server.add_generic_rpc_handlers((GrpcCheck(settings),))
    server.add_insecure_port(grpc_listen)
    await server.start()
    logging.getLogger("body_check").info("checking on HTTP %s, gRPC %s", http_listen, grpc_listen)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(grace=5)
    with contextlib.suppress(Exception):
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the KServe body check in front of Triton")
    parser.add_argument("--triton-http", default="127.0.0.1:18000", help="Triton's HTTP host:port")
    parser.add_argument("--triton-grpc", default="127.0.0.1:18001", help="Triton's gRPC host:port")
    parser.add_argument("--http-listen", default="127.0.0.1:18004", help="host:port for HTTP")
    parser.add_argument("--grpc-listen", default="127.0.0.1:18005", help="host:port for gRPC")
    parser.add_argument(
        "--max-body-size", default="8m", help="the front door's MAX_BODY_SIZE (like 8m or 512k)"
    )
    args = parser.parse_args(argv)
    try:
        max_body = nginx_size(args.max_body_size, "--max-body-size")
    except BadValue as err:
        parser.error(str(err))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = CheckSettings(args.triton_http, args.triton_grpc, max_body)
    asyncio.run(serve(settings, args.http_listen, args.grpc_listen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
