package handler

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"

	"github.com/gin-gonic/gin"

	"shop/internal/stock"
)

// decode reads exactly one JSON object into v, a pointer to a struct,
// refusing unknown fields, values of the wrong type and anything after the
// object. Field names must match exactly and appear once (see exactNames).
// Its errors say what is wrong in words meant for the client, without Go
// type names.
func decode(c *gin.Context, v any) error {
	body, err := readBody(c)
	if err != nil {
		return err
	}
	defer body.release()
	return decodeBytes(body.b, v)
}

// body is a request's body, read into a buffer of bodyPool.
type body struct{ b []byte }

// bodyPool keeps the buffers bodies are read into: every order's body is
// read whole before it is decoded, and a buffer per request would be
// garbage at the rate orders come.
var bodyPool = sync.Pool{New: func() any { return &body{b: make([]byte, 0, 512)} }}

// readBody reads the request's body whole, into a buffer that release
// gives back: decode's errors for a body that could not be read.
func readBody(c *gin.Context) (*body, error) {
	bd := bodyPool.Get().(*body)
	b := bd.b[:0]
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := c.Request.Body.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			bd.b = b
			return bd, nil
		}
		if err != nil {
			bd.b = b
			bd.release()
			if maxBytes := (*http.MaxBytesError)(nil); errors.As(err, &maxBytes) {
				return nil, errTooLarge
			}
			return nil, invalid("the body could not be read")
		}
	}
}

// release gives the buffer back to bodyPool, unless it grew past what the
// largest body allowed needs.
func (bd *body) release() {
	if cap(bd.b) > 2*maxBodyBytes {
		return
	}
	bd.b = bd.b[:0]
	bodyPool.Put(bd)
}

// decodeBytes is decode of a body already read.
func decodeBytes(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			return invalid("the body must hold a single JSON object")
		}
		return exactNames(body, v)
	}
	var (
		syntax    *json.SyntaxError
		typeError *json.UnmarshalTypeError
	)
	switch {
	case errors.Is(err, io.EOF):
		return invalid("the body is empty")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return invalid("malformed JSON: unexpected end")
	case errors.As(err, &syntax):
		return invalid(fmt.Sprintf("malformed JSON at byte %d", syntax.Offset))
	case errors.As(err, &typeError):
		if typeError.Field == "" {
			return invalid("the body must be a JSON object")
		}
		return invalid(typeError.Field + " must be an integer in range")
	}
	var unknown string
	if _, serr := fmt.Sscanf(err.Error(), "json: unknown field %q", &unknown); serr == nil {
		return invalid("unknown field " + strconv.Quote(unknown))
	}
	return invalid("malformed JSON")
}

// exactNames refuses what encoding/json lets through in body, a JSON value
// that decoded into v: a member of the object whose name is one of v's
// fields in other letter case ("SKU_ID" is taken as "sku_id"), and a member
// given twice (the last one wins). Both let a body mean something other
// than what a reader of it, or a filter in front of the service, sees.
func exactNames(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil // not an object: decode has judged it already
	}
	fields := fieldNames(v)
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return invalid("malformed JSON")
		}
		name, _ := t.(string)
		switch {
		case !fields[name]:
			return invalid("unknown field " + strconv.Quote(name))
		case seen[name]:
			return invalid("field " + strconv.Quote(name) + " given twice")
		}
		seen[name] = true
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return invalid("malformed JSON")
		}
	}
	return nil
}

// fieldNames returns the JSON names of the fields of the struct v points
// to.
func fieldNames(v any) map[string]bool {
	t := reflect.TypeOf(v).Elem()
	names := make(map[string]bool, t.NumField())
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		names[name] = true
	}
	return names
}

func invalid(msg string) error { return fmt.Errorf("%w: %s", stock.ErrInvalid, msg) }

// pathID parses the :id path parameter: a positive decimal int64 written
// the one way it prints, so "+5", "007" and " 7" are refused rather than
// read as 5 and 7 — ids that a cache or a log in front of the service
// would take for other resources.
func pathID(c *gin.Context) (int64, error) {
	s := c.Param("id")
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 || strconv.FormatInt(id, 10) != s {
		return 0, invalid("id must be a positive integer, in decimal without sign or leading zeros")
	}
	return id, nil
}
