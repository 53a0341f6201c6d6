// Command testserver is the workload of the container and microVM tests: a
// static HTTP server answering the health routes of the inference presets
// (/health as vLLM, /api/tags as Ollama) on $PORT (default 8080). It exits
// 0 on SIGTERM unless $IGNORE_TERM is set (then only SIGKILL stops it),
// prints the names of the files in $LIST_DIR at start (the secrets
// test), and with $HEALTH_OK_REQUESTS=N answers /health 503 after its
// first N requests (the healthcheck_failed test). ocitest builds it with CGO_ENABLED=0 into the test image.
package main

import (
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
)

func main() {
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	if dir := os.Getenv("LIST_DIR"); dir != "" {
		entries, err := os.ReadDir(dir)
		fmt.Println("list", dir, len(entries), err)
	}
	sig := make(chan os.Signal, 1)
	if os.Getenv("IGNORE_TERM") != "" {
		signal.Ignore(syscall.SIGTERM)
	} else {
		signal.Notify(sig, syscall.SIGTERM)
	}
	mux := http.NewServeMux()
	okLeft := int64(-1) // unlimited
	if n, err := strconv.Atoi(os.Getenv("HEALTH_OK_REQUESTS")); err == nil {
		okLeft = int64(n)
	}
	var served atomic.Int64
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) {
		if okLeft >= 0 && served.Add(1) > okLeft {
			http.Error(w, "unhealthy (HEALTH_OK_REQUESTS)", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/api/tags", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, `{"models":[]}`) })
	go func() {
		if err := http.ListenAndServe(":"+port, mux); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
	}()
	fmt.Println("listening on", port)
	<-sig
	fmt.Println("SIGTERM: exiting")
}
