"""The asyncio/aiohttp server of one process: every route on one port, the I/O of each connection, the engine's client on the event loop, metrics, the voice store."""
