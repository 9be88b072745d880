"""A loopback HTTP server with byte-range support (for recipes/download.lua tests).
usage: range_http_server.py DIR PORTFILE  — serves DIR on 127.0.0.1, writes its port to PORTFILE."""
import http.server, os, sys, functools

class Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def send_head(self):
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            self.send_error(404)
            return None
        size = os.path.getsize(path)
        rng = self.headers.get("Range")
        f = open(path, "rb")
        if rng and rng.startswith("bytes="):
            start = int(rng[6:].split("-")[0] or 0)
            if start >= size:
                self.send_response(416); self.end_headers(); f.close(); return None
            f.seek(start)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{size-1}/{size}")
            self.send_header("Content-Length", str(size - start))
        else:
            self.send_response(200)
            self.send_header("Content-Length", str(size))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        return f

if __name__ == "__main__":
    d, portfile = sys.argv[1], sys.argv[2]
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=d))
    with open(portfile + ".tmp", "w") as fh:
        fh.write(str(srv.server_address[1]))
    os.rename(portfile + ".tmp", portfile)
    srv.timeout = 1
    import time
    deadline = time.time() + 120  # stops by itself
    while time.time() < deadline and os.path.exists(portfile):
        srv.handle_request()
