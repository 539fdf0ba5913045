"""Support code that the tests and the benchmarks share: fakes, references and client helpers.

Never imported by the serving code or the builder. Only tests import from ``tests/``; everything
both need lives here.
"""
