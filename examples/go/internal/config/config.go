// Package config makes the examples' idem.Client from the environment, as
// tools/quickstart.sh leaves it: IDEM_TOKEN from .idem/env, the gateways on
// 127.0.0.1:8001-8003 (IDEM_HTTP overrides: "http://host:port,..."), and with --tls the CA
// in IDEM_TLS_CA (the nodes are then https://), presenting the client certificate in
// IDEM_TLS_CERT and IDEM_TLS_KEY when they are set (tls.http_client_certs).
package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
	"time"

	"idemd.dev/idem"
)

// Client returns a client of the cluster named by the environment.
func Client() (*idem.Client, error) {
	nodes := os.Getenv("IDEM_HTTP")
	if nodes == "" {
		nodes = "127.0.0.1:8001,127.0.0.1:8002,127.0.0.1:8003"
	}
	opts := idem.Options{Nodes: strings.Split(nodes, ","), Token: os.Getenv("IDEM_TOKEN"),
		Timeout: 5 * time.Second}
	if ca := os.Getenv("IDEM_TLS_CA"); ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no certificate", ca)
		}
		opts.TLSConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		cert, key := os.Getenv("IDEM_TLS_CERT"), os.Getenv("IDEM_TLS_KEY")
		if (cert == "") != (key == "") {
			return nil, fmt.Errorf("IDEM_TLS_CERT and IDEM_TLS_KEY: a client certificate needs its key")
		}
		if cert != "" {
			pair, err := tls.LoadX509KeyPair(cert, key)
			if err != nil {
				return nil, err
			}
			opts.TLSConfig.Certificates = []tls.Certificate{pair}
		}
	}
	if opts.Token == "" {
		return nil, fmt.Errorf("IDEM_TOKEN is not set (. .idem/env after tools/quickstart.sh)")
	}
	return idem.New(opts)
}
