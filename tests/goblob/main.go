// Command goblob downloads one blob from an OCI registry the way `ollama pull` does, with Go's own net/http.
//
// Usage: goblob [-insecure] [-token T] [-min-part-size N] [-models DIR] REGISTRY NAMESPACE/MODEL sha256:HEX
//
// It follows the rules of Ollama's server/download.go at v0.33.0-rc2 (commit
// fb30760996871fa9460115c753afd2c60d4ab0f7, tests/data/ollama_pin.json), each cited by file:line below; it is
// written from those rules, not copied. net/http decides what only net/http can: which redirects the client
// follows, which headers cross them, and what Response.Location() answers without a Location header.
//
// It prints one JSON line on stdout: {"ok": true, "size", "status", "location", "location_host", "parts",
// "sha256_verified", "requests"} and exits 0, or {"ok": false, "stage", "error", "requests"} with Go's error
// text, the same on stderr, and exits 1. "requests" lists every HTTP request as net/http sent it (each hop of a
// redirect separately). Only the standard library is used (Go 1.19).
package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// server/download.go:31,34-36,99-105 and manifest/paths.go:15.
const (
	maxRetries                = 6
	numDownloadParts          = 16
	maxDownloadPartSize int64 = 1000 * 1000 * 1000
	directURLTimeout          = 30 * time.Second // download.go:232
)

var (
	errMaxRetriesExceeded   = errors.New("max retries exceeded")
	errMaxRedirectsExceeded = errors.New("maximum redirects exceeded (10) for directURL")
	errInvalidDigestFormat  = errors.New("invalid digest format")
	errDigestMismatch       = errors.New("digest mismatch, file must be downloaded again") // server/images.go:1447
	digestPattern           = regexp.MustCompile("^sha256[:-][0-9a-fA-F]{64}$")            // manifest/paths.go:42
)

// ---------------------------------------------------------------- what net/http sent

type hop struct {
	Method        string `json:"method"`
	URL           string `json:"url"`
	Host          string `json:"host"`
	Status        int    `json:"status"`
	Location      string `json:"location,omitempty"`
	Range         string `json:"range,omitempty"`
	Authorization bool   `json:"authorization"`
	Error         string `json:"error,omitempty"`
}

// logTransport records each request the clients send. It sits below http.Client, so the redirect policy,
// the headers kept across redirects and Location() stay net/http's own.
type logTransport struct {
	next http.RoundTripper
	mu   sync.Mutex
	hops []hop
}

func (t *logTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	h := hop{Method: req.Method, URL: req.URL.String(), Host: req.URL.Host, Range: req.Header.Get("Range"),
		Authorization: req.Header.Get("Authorization") != ""}
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		h.Error = err.Error()
	} else {
		h.Status = resp.StatusCode
		h.Location = resp.Header.Get("Location")
	}
	t.mu.Lock()
	t.hops = append(t.hops, h)
	t.mu.Unlock()
	return resp, err
}

func (t *logTransport) log() []hop {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]hop(nil), t.hops...)
}

// ---------------------------------------------------------------- the registry requests (server/images.go)

type registryOptions struct {
	Insecure      bool
	Token         string
	CheckRedirect func(req *http.Request, via []*http.Request) error
}

// makeRequest: server/images.go:1370-1412. --insecure turns the URL to http in place (:1371-1373), a token is
// sent as a bearer (:1385-1386), and a fresh http.Client carries only the caller's CheckRedirect (:1403-1405).
func makeRequest(ctx context.Context, method string, requestURL *url.URL, opts *registryOptions) (*http.Response, error) {
	if requestURL.Scheme != "http" && opts.Insecure {
		requestURL.Scheme = "http"
	}
	req, err := http.NewRequestWithContext(ctx, method, requestURL.String(), nil)
	if err != nil {
		return nil, err
	}
	if opts.Token != "" {
		req.Header.Set("Authorization", "Bearer "+opts.Token)
	}
	req.Header.Set("User-Agent", "ollama/0.33.0-rc2 (modelmint goblob) Go/"+strings.TrimPrefix(runtime.Version(), "go"))
	c := &http.Client{CheckRedirect: opts.CheckRedirect}
	return c.Do(req)
}

// makeRequestWithRetry: server/images.go:1309-1353, less the bearer-token challenge (no registry in these
// tests asks for one): 404 is os.ErrNotExist, another status >= 400 is "CODE: BODY".
func makeRequestWithRetry(ctx context.Context, method string, requestURL *url.URL, opts *registryOptions) (*http.Response, error) {
	resp, err := makeRequest(ctx, method, requestURL, opts)
	if err != nil {
		return nil, err
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized:
		resp.Body.Close()
		return nil, errors.New("401: goblob does not answer a registry's auth challenge (images.go:1321-1336)")
	case resp.StatusCode == http.StatusNotFound:
		resp.Body.Close()
		return nil, os.ErrNotExist
	case resp.StatusCode >= http.StatusBadRequest:
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return nil, fmt.Errorf("%d: %s", resp.StatusCode, err)
		}
		return nil, fmt.Errorf("%d: %s", resp.StatusCode, body)
	}
	return resp, nil
}

// ---------------------------------------------------------------- one blob (server/download.go)

type part struct {
	N         int   `json:"n"`
	Offset    int64 `json:"offset"`
	Size      int64 `json:"size"`
	Completed int64 `json:"completed"`
}

type download struct {
	digest, path string
	total        int64
	parts        []*part
	minPartSize  int64
}

// prepare: download.go:149-178. A HEAD through the registry options as they are (no CheckRedirect: net/http's
// default policy follows every redirect), Content-Length as the size (a parse error leaves 0), then parts of
// total/16 bytes clamped to [min, 1000 MB].
func (d *download) prepare(ctx context.Context, requestURL *url.URL, opts *registryOptions) error {
	resp, err := makeRequestWithRetry(ctx, http.MethodHead, requestURL, opts)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	d.total, _ = strconv.ParseInt(resp.Header.Get("Content-Length"), 10, 64)
	size := d.total / numDownloadParts
	switch {
	case size < d.minPartSize:
		size = d.minPartSize
	case size > maxDownloadPartSize:
		size = maxDownloadPartSize
	}
	var offset int64
	for offset < d.total {
		if offset+size > d.total {
			size = d.total - offset
		}
		d.parts = append(d.parts, &part{N: len(d.parts), Offset: offset, Size: size})
		offset += size
	}
	return nil
}

// newBackoff: download.go:192-216, n² × 10 ms capped, times 0.5-1.5.
func newBackoff(maxBackoff time.Duration) func(ctx context.Context) error {
	var n int
	return func(ctx context.Context) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		n++
		d := time.Duration(n*n) * 10 * time.Millisecond
		if d > maxBackoff {
			d = maxBackoff
		}
		t := time.NewTimer(time.Duration(float64(d) * (rand.Float64() + 0.5)))
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		}
	}
}

// directURL: download.go:231-272. A GET of the blob URL within 30 s, retried with backoff on a request error;
// its CheckRedirect (:242-256) follows a redirect to the same hostname (any port) and keeps the first redirect
// to another host as the answer. The status must be 307 or 200 (:267-268), and the URL is resp.Location()
// (:270): net/http's, which without the header is http.ErrNoLocation.
func directURL(ctx context.Context, requestURL *url.URL, opts *registryOptions) (*url.URL, int, error) {
	ctx, cancel := context.WithTimeout(ctx, directURLTimeout)
	defer cancel()
	backoff := newBackoff(10 * time.Second)
	for {
		newOpts := *opts
		newOpts.CheckRedirect = func(req *http.Request, via []*http.Request) error {
			if len(via) > 10 {
				return errMaxRedirectsExceeded
			}
			if req.URL.Hostname() == requestURL.Hostname() {
				return nil
			}
			return http.ErrUseLastResponse
		}
		resp, err := makeRequestWithRetry(ctx, http.MethodGet, requestURL, &newOpts)
		if err != nil {
			if err := backoff(ctx); err != nil {
				return nil, 0, err
			}
			continue
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusTemporaryRedirect && resp.StatusCode != http.StatusOK {
			return nil, resp.StatusCode, fmt.Errorf("unexpected status code %d", resp.StatusCode)
		}
		loc, err := resp.Location()
		return loc, resp.StatusCode, err
	}
}

// offsetWriter is io.NewOffsetWriter (Go 1.20, which download.go:288 uses) for Go 1.19.
type offsetWriter struct {
	f   *os.File
	off int64
}

func (w *offsetWriter) Write(b []byte) (int, error) {
	n, err := w.f.WriteAt(b, w.off)
	w.off += int64(n)
	return n, err
}

// downloadChunk: download.go:333-365. A GET of the direct URL through http.DefaultClient (:345: none of the
// registry's credentials) with Range bytes=START-END of what the part lacks; its status is not looked at, and
// io.CopyN takes what the part lacks. A short body is io.EOF: the progress is rolled back and it is an error
// (:351-356); io.ErrUnexpectedEOF keeps the progress for the next try. (Ollama's stall watchdog, :367-395, is
// left out: a stalled part here fails the test's timeout instead.)
func downloadChunk(ctx context.Context, direct *url.URL, f *os.File, p *part) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, direct.String(), nil)
	if err != nil {
		return err
	}
	start, stop := p.Offset+p.Completed, p.Offset+p.Size
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", start, stop-1))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	n, err := io.CopyN(&offsetWriter{f, start}, resp.Body, p.Size-p.Completed)
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return err
	}
	p.Completed += n
	return err
}

// run: download.go:218-331. The partial file sized to the total, the direct URL, then every part at once (at
// most 16 at a time), each tried maxRetries times with 2^try s between; then the file takes the blob's name.
func (d *download) run(ctx context.Context, requestURL *url.URL, opts *registryOptions) (*url.URL, int, string, error) {
	file, err := os.OpenFile(d.path+"-partial", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, 0, "direct", err
	}
	defer file.Close()
	_ = file.Truncate(d.total)

	direct, status, err := directURL(ctx, requestURL, opts)
	if err != nil {
		return nil, status, "direct", err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sem := make(chan struct{}, numDownloadParts)
	errs := make(chan error, len(d.parts))
	var wg sync.WaitGroup
	for _, p := range d.parts {
		if p.Completed == p.Size {
			continue
		}
		p := p
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			var err error
			for try := 0; try < maxRetries; try++ {
				if err = downloadChunk(ctx, direct, file, p); err == nil {
					return
				}
				if errors.Is(err, context.Canceled) {
					errs <- err
					return
				}
				time.Sleep(time.Second * time.Duration(math.Pow(2, float64(try))))
			}
			errs <- fmt.Errorf("%v: %w", errMaxRetriesExceeded, err) // download.go:307
			cancel()
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return direct, status, "chunk", err
	}
	if err := file.Close(); err != nil {
		return direct, status, "chunk", err
	}
	return direct, status, "chunk", os.Rename(file.Name(), d.path)
}

// verifyBlob: server/images.go:1449-1467, and the file removed on a mismatch (:1060-1071).
func verifyBlob(digest, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	h := sha256.New()
	_, err = io.Copy(h, f)
	f.Close()
	if err != nil {
		return err
	}
	if got := fmt.Sprintf("sha256:%x", h.Sum(nil)); got != digest {
		os.Remove(path)
		return fmt.Errorf("%w: want %s, got %s", errDigestMismatch, digest, got)
	}
	return nil
}

type result struct {
	OK             bool    `json:"ok"`
	Stage          string  `json:"stage,omitempty"`
	Error          string  `json:"error,omitempty"`
	Digest         string  `json:"digest"`
	Size           int64   `json:"size"`
	Status         int     `json:"status,omitempty"`
	Location       string  `json:"location,omitempty"`
	LocationHost   string  `json:"location_host,omitempty"`
	Parts          []*part `json:"parts"`
	SHA256Verified bool    `json:"sha256_verified"`
	Requests       []hop   `json:"requests"`
}

func main() {
	insecure := flag.Bool("insecure", false, "speak plain http to the registry (ollama pull --insecure)")
	token := flag.String("token", "", "a bearer token sent to the registry (never to a redirect's other host)")
	minPart := flag.Int64("min-part-size", 100*1000*1000, "the smallest part (Ollama's: 100 MB, download.go:101)")
	models := flag.String("models", "", "where blobs/ goes (default: a temporary directory, removed)")
	flag.Parse()
	if flag.NArg() != 3 {
		fmt.Fprintln(os.Stderr, "usage: goblob [-insecure] [-token T] [-min-part-size N] [-models DIR] REGISTRY NAMESPACE/MODEL sha256:HEX")
		os.Exit(2)
	}
	registry, repository, digest := flag.Arg(0), flag.Arg(1), flag.Arg(2)

	logged := &logTransport{next: http.DefaultTransport}
	http.DefaultTransport = logged // what both makeRequest's client and http.DefaultClient send through

	res := result{Digest: digest, Parts: []*part{}}
	var tmp string
	fail := func(stage string, err error) {
		if tmp != "" {
			os.RemoveAll(tmp)
		}
		res.Stage, res.Error, res.Requests = stage, err.Error(), logged.log()
		out, _ := json.Marshal(res)
		fmt.Println(string(out))
		fmt.Fprintln(os.Stderr, err.Error())
		os.Exit(1)
	}

	dir := *models
	if dir == "" {
		made, err := os.MkdirTemp("", "goblob-")
		if err != nil {
			fail("setup", err)
		}
		tmp, dir = made, made
		defer os.RemoveAll(tmp)
	}
	// manifest/paths.go:40-61: only a sha256 digest names a blob file, ':' written as '-'
	if digest == "" || !digestPattern.MatchString(digest) {
		fail("digest", errInvalidDigestFormat)
	}
	path := filepath.Join(dir, "blobs", strings.ReplaceAll(digest, ":", "-"))
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		fail("setup", err)
	}

	// download.go:505-506 with types/model/name.go:317-323: https://HOST/v2/NAMESPACE/MODEL/blobs/DIGEST
	base := &url.URL{Scheme: "https", Host: registry}
	if u, err := url.Parse(registry); err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" {
		base = &url.URL{Scheme: u.Scheme, Host: u.Host}
	}
	requestURL := base.JoinPath("v2", repository, "blobs", digest)
	opts := &registryOptions{Insecure: *insecure, Token: *token}
	d := &download{digest: digest, path: path, minPartSize: *minPart}
	ctx := context.Background()

	if err := d.prepare(ctx, requestURL, opts); err != nil {
		fail("head", err)
	}
	res.Size, res.Parts = d.total, d.parts
	direct, status, stage, err := d.run(ctx, requestURL, opts)
	res.Status = status
	if direct != nil {
		res.Location, res.LocationHost = direct.String(), direct.Host
	}
	if err != nil {
		fail(stage, err)
	}
	if err := verifyBlob(digest, path); err != nil {
		fail("verify", err)
	}
	res.OK, res.SHA256Verified, res.Requests = true, true, logged.log()
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
}
