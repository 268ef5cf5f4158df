package handler

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"

	"shop/internal/stock"
)

// decode reads exactly one JSON object into v, refusing unknown fields,
// values of the wrong type and anything after the object. Its errors say
// what is wrong in words meant for the client, without Go type names.
func decode(c *gin.Context, v any) error {
	dec := json.NewDecoder(c.Request.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			return invalid("the body must hold a single JSON object")
		}
		return nil
	}
	var (
		maxBytes  *http.MaxBytesError
		syntax    *json.SyntaxError
		typeError *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &maxBytes):
		return errTooLarge
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

func invalid(msg string) error { return fmt.Errorf("%w: %s", stock.ErrInvalid, msg) }

// pathID parses the :id path parameter as a positive int64.
func pathID(c *gin.Context) (int64, error) {
	id, err := strconv.ParseInt(c.Param("id"), 10, 64)
	if err != nil || id <= 0 {
		return 0, invalid("id must be a positive integer")
	}
	return id, nil
}
