// orders: a small net/http order service whose POST /orders runs at most once per
// Idempotency-Key, behind idem.Middleware; GET /orders/{id} is not behind it.
//
//	orders [-listen 127.0.0.1:9000]   (IDEM_TOKEN, and IDEM_HTTP or the quickstart's gateways)
//
// It logs the address it serves on once it listens ("orders on http://127.0.0.1:9000"; a
// port 0 is chosen by the kernel and shown so).
//
//	curl -si -X POST localhost:9000/orders -H 'Idempotency-Key: o-1' \
//	     -H 'content-type: application/json' -d '{"amount": 10}'      # 201, order 1
//	curl -si -X POST localhost:9000/orders -H 'Idempotency-Key: o-1' \
//	     -H 'content-type: application/json' -d '{"amount": 10}'      # the same 201,
//	                                                                   # Idempotency-Replayed: true
//	curl -si -X POST localhost:9000/orders -H 'Idempotency-Key: o-1' \
//	     -H 'content-type: application/json' -d '{"amount": 99}'      # 409 idempotency_key_reused
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"idemd.dev/idem"
	"idemd.dev/idem/examples/internal/config"
)

type store struct {
	mu     sync.Mutex
	orders []json.RawMessage
}

func (s *store) create(w http.ResponseWriter, r *http.Request) {
	var order struct {
		Amount int `json:"amount"`
	}
	body := json.NewDecoder(r.Body)
	if err := body.Decode(&order); err != nil || order.Amount <= 0 {
		// A 4xx: the middleware releases the key, the next try runs again.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		w.Write([]byte(`{"error": "want {\"amount\": N}"}` + "\n"))
		return
	}
	fence, _ := idem.TokenFromContext(r.Context())
	s.mu.Lock()
	id := len(s.orders) + 1
	rec, _ := json.Marshal(map[string]interface{}{"id": id, "amount": order.Amount, "fence": fence})
	s.orders = append(s.orders, rec)
	s.mu.Unlock()
	log.Printf("order %d created (amount %d, fencing token %d)", id, order.Amount, fence)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", id))
	w.WriteHeader(http.StatusCreated)
	w.Write(append(rec, '\n'))
}

func (s *store) get(w http.ResponseWriter, r *http.Request) {
	var id int
	if _, err := fmt.Sscanf(strings.TrimPrefix(r.URL.Path, "/orders/"), "%d", &id); err != nil {
		http.NotFound(w, r)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if id < 1 || id > len(s.orders) {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(append(s.orders[id-1], '\n'))
}

func main() {
	listen := flag.String("listen", "127.0.0.1:9000", "address to serve on")
	flag.Parse()
	c, err := config.Client()
	if err != nil {
		log.Fatal(err)
	}
	s := &store{}
	mux := http.NewServeMux()
	mux.HandleFunc("/orders", s.create)
	mux.HandleFunc("/orders/", s.get)
	// POST /orders with an Idempotency-Key goes through idemd; a POST without one, and
	// every GET, straight to the mux.
	h := idem.Middleware(c, idem.Route{Method: "POST", PathPrefix: "/orders", Lease: 10 * time.Second})(mux)
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("orders on http://%s", ln.Addr())
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.Serve(ln))
}
