package handler

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/gin-gonic/gin"
)

// TestEncodedAnswersAreMarshalled checks every pre-encoded body against
// json.Marshal of the value it stands for: each row of answers, a 5xx with
// the ids a request can have (nginx's, a generated one, none, and one that
// needs escaping, which is encoded as before), and the body of /healthz.
func TestEncodedAnswersAreMarshalled(t *testing.T) {
	encoded := 0
	for i, a := range answers {
		if a.message == "" {
			if encodedAnswers[i] != nil {
				t.Errorf("%s: encoded though its message is the error's", a.code)
			}
			continue
		}
		encoded++
		for _, id := range []string{"0f1e2d3c4b5a69788796a5b4c3d2e1f0", "req-1.a:b_c", "", `a"b<c>`} {
			detail := errorDetail{Code: a.code, Message: a.message}
			if a.status >= http.StatusInternalServerError {
				detail.RequestID = id
			}
			want, err := json.Marshal(errorBody{Error: detail})
			if err != nil {
				t.Fatal(err)
			}
			if got := errorJSON(a, i, id); !bytes.Equal(got, want) {
				t.Errorf("%s, id %q:\n got %s\nwant %s", a.code, id, got, want)
			}
		}
	}
	if encoded < 20 {
		t.Errorf("%d rows encoded, want every row with a message of its own", encoded)
	}
	want, err := json.Marshal(gin.H{"status": "ok"})
	if err != nil {
		t.Fatal(err)
	}
	if statusOK != string(want) {
		t.Errorf("healthz body %s, want %s", statusOK, want)
	}
}
