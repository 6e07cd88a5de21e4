# Both binaries in one small static image.
#   docker build --build-arg VERSION=$(git describe --tags --always) --build-arg REVISION=$(git rev-parse --short HEAD) -t ghcr.io/fleet/ingest:dev .
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=devel
ARG REVISION=unknown
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath \
    -ldflags="-s -w -X github.com/fleet/ingest/internal/buildinfo.version=${VERSION} -X github.com/fleet/ingest/internal/buildinfo.revision=${REVISION}" \
    -o /out/ ./cmd/worker ./cmd/enqueue

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/worker /out/enqueue /
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["/worker"]
