// Two goroutines handing an integer back and forth over unbuffered channels N times
// (held-out.sh); prints the seconds taken.
//
//	chan N
package main

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

func main() {
	n, _ := strconv.Atoi(os.Args[1])
	a := make(chan int)
	b := make(chan int)
	go func() {
		for v := range a {
			b <- v + 1
		}
	}()
	t := time.Now()
	x := 0
	for i := 0; i < n; i++ {
		a <- x
		x = <-b
	}
	fmt.Println(time.Since(t).Seconds())
}
