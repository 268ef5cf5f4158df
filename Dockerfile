# The shop binary in a small image: built static in the first stage, run as
# an unprivileged user in the second. Used by docker-compose.yml. The build
# context is what .dockerignore keeps: the module's files and the sources
# copied below, never .git, bin/, out/ or the live MariaDB files of .state/.
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
# Ready on whatever port SHOP_HTTP_ADDR names (":9090", "0.0.0.0:9090"):
# shop healthcheck GETs /readyz there on the loopback and exits 0 or 1,
# with no shell or wget, as it would in a distroless image. Its own timeout
# (2 s) is below --timeout, so a replica that does not answer is reported
# with the reason.
HEALTHCHECK --interval=2s --timeout=3s --retries=30 CMD ["shop", "healthcheck"]
ENTRYPOINT ["shop"]
CMD ["serve"]
