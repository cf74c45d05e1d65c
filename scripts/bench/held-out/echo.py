#!/usr/bin/env python3
"""An asyncio TCP echo server in a forked child and a blocking client in the parent doing N
round trips of 64 bytes over loopback (held-out.sh): an event-loop server in an interpreter.

    echo.py N"""
import asyncio, os, socket, sys
n = int(sys.argv[1])
port = 21000 + os.getpid() % 1000
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    async def handle(reader, writer):
        while True:
            d = await reader.read(4096)
            if not d:
                break
            writer.write(d)
            await writer.drain()
        writer.close()
    async def main():
        srv = await asyncio.start_server(handle, "127.0.0.1", port)
        os.write(w, b"x"); os.close(w)
        async with srv:
            await srv.serve_forever()
    asyncio.run(main())
    os._exit(0)
os.close(w); os.read(r, 1)
try:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    m = b"x" * 64
    for _ in range(n):
        s.sendall(m)
        got = 0
        while got < 64:
            d = s.recv(4096)
            if not d:
                sys.exit("echo.py: the server closed the connection")
            got += len(d)
    s.close()
finally:
    os.kill(pid, 15)
    os.waitpid(pid, 0)
