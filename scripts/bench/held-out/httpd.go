// A minimal net/http server answering every request with 12 bytes (held-out.sh): Go's
// runtime spins idle Ps briefly before it parks them, its own retention.
//
//	httpd PORT
package main

import (
	"net/http"
	"os"
)

func main() {
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("hello world\n")) })
	http.ListenAndServe("127.0.0.1:"+os.Args[1], nil)
}
