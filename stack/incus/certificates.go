package incus

import (
	"context"
	"fmt"
	"net/http"
)

// Certificate is an entry of the trust store (GET /1.0/certificates/{fp}).
type Certificate struct {
	Name        string   `json:"name"`
	Type        string   `json:"type"`
	Restricted  bool     `json:"restricted"`
	Projects    []string `json:"projects"`
	Certificate string   `json:"certificate"` // PEM
	Fingerprint string   `json:"fingerprint,omitempty"`
}

// Certificates lists the trust store.
func (c *Client) Certificates(ctx context.Context) ([]Certificate, error) {
	var out []Certificate
	if err := c.list(ctx, apiPath("certificates"), nil, &out); err != nil {
		return nil, fmt.Errorf("listing trusted certificates: %w", err)
	}
	return out, nil
}

// AddCertificate trusts a client certificate (cert is the base64 of its
// DER form, as the API takes it).
func (c *Client) AddCertificate(ctx context.Context, cert Certificate) error {
	if _, err := c.do(ctx, request{method: http.MethodPost, path: apiPath("certificates"), json: cert}); err != nil {
		return fmt.Errorf("trusting certificate %s: %w", cert.Name, err)
	}
	return nil
}

// DeleteCertificate removes a certificate from the trust store.
func (c *Client) DeleteCertificate(ctx context.Context, fingerprint string) error {
	if _, err := c.do(ctx, request{method: http.MethodDelete, path: apiPath("certificates", fingerprint)}); err != nil {
		return fmt.Errorf("removing trusted certificate %s: %w", fingerprint, err)
	}
	return nil
}
