// A minimal Node.js http server (held-out.sh): one event loop.
//     node server.js PORT
const http = require('http');
http.createServer((req, res) => { res.end('hello world\n'); }).listen(+process.argv[2], '127.0.0.1');
