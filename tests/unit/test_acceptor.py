"""server/acceptor.py with real sockets in one event loop: two acceptors on one listening socket (as two workers on
the port's socket); a full one leaves connections to the other, and takes one only when it waited out its pause."""
import asyncio
import socket

from talkgate.server import acceptor
from talkgate.server.acceptor import Acceptor


class Counted(asyncio.Protocol):
    def __init__(self, made: list):
        self.made = made

    def connection_made(self, transport):
        self.made.append(transport)


def listening() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.setblocking(False)
    return s


async def connect(port: int) -> socket.socket:
    c = socket.socket()
    c.setblocking(False)
    await asyncio.get_running_loop().sock_connect(c, ("127.0.0.1", port))
    return c


def test_a_full_acceptor_leaves_connections_to_the_other_then_takes_one_that_waited():
    async def go():
        loop = asyncio.get_running_loop()
        s = listening()
        port = s.getsockname()[1]
        made_a, made_b = [], []
        full = {"a": True, "b": False}
        a = Acceptor(loop, [s.dup()], lambda: Counted(made_a), None, lambda: full["a"])
        b = Acceptor(loop, [s.dup()], lambda: Counted(made_b), None, lambda: full["b"])
        a.start(16)
        b.start(16)
        clients = []
        for _ in range(5):
            clients.append(await connect(port))
            await asyncio.sleep(0.01)
        await asyncio.sleep(2 * acceptor.FULL_ACCEPT_S)
        assert (len(made_a), len(made_b)) == (0, 5)
        full["b"] = True                    # both full: a connection still waiting after a pause is taken
        clients.append(await connect(port))
        await asyncio.sleep(3 * acceptor.FULL_ACCEPT_S)
        assert len(made_a) + len(made_b) == 6
        a.stop()
        b.stop()
        for t in made_a + made_b:
            t.close()
        for c in clients:
            c.close()
        s.close()
    asyncio.run(go())


def test_a_stopped_acceptor_closes_only_its_own_socket():
    async def go():
        loop = asyncio.get_running_loop()
        s = listening()
        made = []
        a = Acceptor(loop, [s.dup()], lambda: Counted(made), None, lambda: False)
        b = Acceptor(loop, [s.dup()], lambda: Counted(made), None, lambda: False)
        a.start(16)
        b.start(16)
        a.stop()
        c = await connect(s.getsockname()[1])
        await asyncio.sleep(0.05)
        assert len(made) == 1
        b.stop()
        made[0].close()
        c.close()
        s.close()
    asyncio.run(go())
