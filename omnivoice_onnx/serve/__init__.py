"""The network servers: everything that answers a socket lives here.

app (OpenAI-style HTTP, FastAPI/uvicorn) and wyoming (Home Assistant's Wyoming protocol) are two
protocol adapters over the same service (service: requests, voices, limits, state) and the same
workers (pool). Whatever reaches the runtime from the network comes in through this package, so the
limits, checks and refusals a network peer meets are kept in one room.
"""
