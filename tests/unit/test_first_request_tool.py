"""bench/first_request.py: request 1's worker stages against the later requests', from each server's traces."""
from bench.first_request import table


def test_request_1_against_the_later_requests():
    runs = [[[1.5, 0.5, 0.1], [0.7, 0.3, 0.1], [0.8, 0.4, 0.1]],
            [[1.7, 0.6, 0.1], [0.6, 0.3, 0.1]],
            []]                                             # a server whose traces were lost: no row of its own
    out = table(runs).splitlines()
    assert out[2] == "| parsed | 1.600 | 1.50 1.70 | 0.700 |"
    assert out[3] == "| tokenized | 0.550 | 0.50 0.60 | 0.300 |"
    assert out[-1] == "| read -> sent | 2.250 | | 1.100 |"
