# The shop binary in a small image: built static in the first stage, run as
# an unprivileged user in the second. Used by docker-compose.yml.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY cmd ./cmd
COPY internal ./internal
COPY migrations ./migrations
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/shop ./cmd/shop

FROM alpine:3.22
RUN adduser -D -H -u 10001 shop
COPY --from=build /out/shop /usr/local/bin/shop
USER shop
ENV SHOP_HTTP_ADDR=:8080
EXPOSE 8080
HEALTHCHECK --interval=2s --timeout=2s --retries=30 CMD wget -q -O /dev/null http://127.0.0.1:8080/readyz || exit 1
ENTRYPOINT ["shop"]
CMD ["serve"]
