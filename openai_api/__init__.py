"""The OpenAI-compatible adapter: ``/v1/embeddings`` and ``/v1/models`` in front of Triton.

An async ASGI app (Starlette, served by uvicorn) that speaks OpenAI's embeddings API to clients
and KServe v2 over gRPC (the asyncio tritonclient) to Triton. It sits behind the front door
(which applies the API key and the limits) and never listens on a public interface itself.

- ``protocol``: OpenAI's request and response shapes, validated and built as plain data;
- ``errors``: OpenAI's error shape and the status of each kind of failure;
- ``backend``: the Triton side: one model's config read once, inputs split into requests the
  model takes, sent concurrently, answered in input order;
- ``app``: the routes.
"""
