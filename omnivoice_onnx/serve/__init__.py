"""The network servers: everything that answers a socket lives here.

One front door (door: byte limits, timeouts, the connection cap, the shape checks and the error
table every surface answers from) and thin protocol adapters over it: app (OpenAI-style HTTP,
FastAPI/uvicorn; connection: its sockets held to door's limits; browser: what a web page may do)
and wyoming (Home Assistant's Wyoming protocol, read off the socket by its own checked reader).
Both hand the same service (service: requests, voices, state; the runtime's one request check)
to the same workers (pool). Whatever reaches the runtime from the network comes in through here,
so the limits, checks and refusals a network peer meets are kept in one room.
"""
