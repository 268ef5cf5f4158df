package handler

import "testing"

// TestParseOrderBodyAgreesWithDecode checks that the order body's parser
// reads the bodies buyers send, with the values decode gives them, and
// leaves every other body to decode.
func TestParseOrderBodyAgreesWithDecode(t *testing.T) {
	for _, tc := range []struct {
		body string
		fast bool // parseOrderBody reads it
	}{
		{`{"sku_id":1,"user_id":7}`, true},
		{`{"user_id":7,"sku_id":1}`, true},
		{" \t\r\n{ \"sku_id\" : 12 ,\n\"user_id\" :\t-3 } \n", true},
		{`{"sku_id":1}`, true},
		{`{"user_id":0}`, true},
		{`{"sku_id":-0,"user_id":999999999999999999}`, true},
		{`{"sku_id":9223372036854775807,"user_id":1}`, false},
		{`{"sku_id":9223372036854775808,"user_id":1}`, false},
		{`{"sku_id":1,"user_id":7,"sku_id":2}`, false},
		{`{"SKU_ID":1,"user_id":7}`, false},
		{`{"sku\u005fid":1,"user_id":7}`, false},
		{`{"sku_id":null,"user_id":7}`, false},
		{`{"sku_id":"1","user_id":7}`, false},
		{`{"sku_id":1.0,"user_id":7}`, false},
		{`{"sku_id":1e2,"user_id":7}`, false},
		{`{"sku_id":01,"user_id":7}`, false},
		{`{"sku_id":1,"user_id":7,"x":1}`, false},
		{`{"sku_id":1,"user_id":7,}`, false},
		{`{"sku_id":1,"user_id":7}{}`, false},
		{`{"sku_id":1,"user_id":7}x`, false},
		{`{"sku_id":1 "user_id":7}`, false},
		{`{"sku_id":1,"user_id":7`, false},
		{`{"sku_id":-,"user_id":7}`, false},
		{`{}`, false},
		{`[]`, false},
		{``, false},
		{"\ufeff{\"sku_id\":1}", false},
	} {
		got, ok := parseOrderBody([]byte(tc.body))
		if ok != tc.fast {
			t.Errorf("%q: parsed %v, want %v", tc.body, ok, tc.fast)
		}
		if !ok {
			continue
		}
		want, err := decodeOrderBody([]byte(tc.body))
		if err != nil {
			t.Errorf("%q: parsed as %+v, decode refuses it: %v", tc.body, got, err)
		} else if got != want {
			t.Errorf("%q: parsed as %+v, decoded as %+v", tc.body, got, want)
		}
	}
}
