"""A gateway worker's warm-up (processes/worker.py warm_http): the Content-Types of JSON bodies parsed before its first
request, which otherwise pays aiohttp's parse of its header (0.4-1.2 ms) in its `parsed` stage."""
import pytest
from aiohttp import helpers, web

from talkgate.processes.worker import JSON_CONTENT_TYPES, warm_http


def test_a_first_requests_content_type_is_parsed_already():
    parse = helpers.parse_content_type
    if not hasattr(parse, "cache_info"):
        pytest.skip("this aiohttp parses a Content-Type each time: nothing to warm")
    parse.cache_clear()
    warm_http()
    misses = parse.cache_info().misses
    for content_type in JSON_CONTENT_TYPES:         # as a request's `charset` reads it (HeadersMixin)
        assert web.Response(headers={"Content-Type": content_type}).charset in (None, "utf-8")
    assert parse.cache_info().misses == misses
