// Four goroutines (GOMAXPROCS: every vCPU) each computing 200 LCG steps then taking one
// sync.Mutex, N times each (held-out.sh): Go's futex-backed lock under contention.
//
//	mutex N
package main

import (
	"os"
	"strconv"
	"sync"
)

func main() {
	n, _ := strconv.Atoi(os.Args[1])
	var mu sync.Mutex
	var wg sync.WaitGroup
	shared := 0
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			x := g
			for i := 0; i < n; i++ {
				for j := 0; j < 200; j++ {
					x = x*1103515245 + 12345
				}
				mu.Lock()
				shared += x & 1
				mu.Unlock()
			}
		}(g)
	}
	wg.Wait()
	if shared < 0 {
		println(shared)
	}
}
