package s3test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// PutMany writes every key of keys with body, failing t on error (PutAll).
func (s *Server) PutMany(t testing.TB, bucket string, keys []string, body []byte) {
	t.Helper()
	if err := s.PutAll(bucket, keys, body); err != nil {
		t.Fatalf("writing to %s: %v", bucket, err)
	}
}

// PutAll writes every key of keys with body, eight requests at a time. It
// sends plain path-style HTTP PUTs rather than going through the AWS SDK
// (the server takes any credentials): signing thousands of requests under
// the race detector is what makes bulk setup slow.
func (s *Server) PutAll(bucket string, keys []string, body []byte) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	next := make(chan string)
	for range 8 {
		wg.Go(func() {
			for key := range next {
				if err := s.put(bucket, key, body); err != nil {
					mu.Lock()
					first = cmpErr(first, err)
					mu.Unlock()
				}
			}
		})
	}
	for _, k := range keys {
		next <- k
	}
	close(next)
	wg.Wait()
	return first
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func (s *Server) put(bucket, key string, body []byte) error {
	req, err := http.NewRequest(http.MethodPut, s.URL+"/"+bucket+"/"+key, strings.NewReader(string(body)))
	if err != nil {
		return err
	}
	resp, err := s.srv.Client().Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("PUT %s: %s", key, resp.Status)
	}
	return nil
}
